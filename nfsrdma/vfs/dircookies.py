"""READDIR cookies that stay valid while a directory changes.

cookie(name) = keyed 63-bit BLAKE2b hash of the name, moved past the reserved values 0, 1, 2.
A directory is served in cookie order, so "continue after cookie c" means "the entries whose
cookie is greater than c", whatever was created or removed meanwhile. Sorted listings are kept in
a small LRU keyed by (fileid, mtime, change count) so that paging through a large directory does
not re-read and re-sort it for every READDIR; a listing is cached only when the directory's mtime
is old enough (50 ms) that any later modification must move it, even with coarse timestamps.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections import OrderedDict
from typing import Final

FIRST_COOKIE: Final = 3
_MASK63: Final = (1 << 63) - 1
MTIME_SETTLE_NS: Final = 50_000_000
MAX_CACHED_ENTRIES: Final = 1 << 20


class CookieJar:
    """Cookie computation plus a bounded cache of sorted directory listings."""

    def __init__(self, secret: bytes, listings: int = 16) -> None:
        self._key = hashlib.blake2b(secret, person=b"nfsrdma-cookie").digest()[:32]
        self.verifier = hashlib.blake2b(secret, person=b"nfsrdma-cverf").digest()[:8]
        self._capacity = listings
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, int, int], tuple[list[int], list[bytes]]] = (
            OrderedDict()
        )

    def cookie(self, name: bytes) -> int:
        h = hashlib.blake2b(name, key=self._key, digest_size=8).digest()
        c = int.from_bytes(h, "big") & _MASK63
        return c if c >= FIRST_COOKIE else c + FIRST_COOKIE

    def sort(self, names: list[bytes]) -> tuple[list[int], list[bytes]]:
        pairs = sorted((self.cookie(n), n) for n in names)
        return [c for c, _ in pairs], [n for _, n in pairs]

    def cached(self, key: tuple[int, int, int]) -> tuple[list[int], list[bytes]] | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def store(
        self, key: tuple[int, int, int], mtime_ns: int, listing: tuple[list[int], list[bytes]]
    ) -> None:
        if len(listing[0]) > MAX_CACHED_ENTRIES or time.time_ns() - mtime_ns < MTIME_SETTLE_NS:
            return
        with self._lock:
            self._cache[key] = listing
            self._cache.move_to_end(key)
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)

    @staticmethod
    def start(cookies: list[int], after: int) -> int:
        """Index of the first entry whose cookie is greater than ``after``."""
        return bisect.bisect_right(cookies, after)
