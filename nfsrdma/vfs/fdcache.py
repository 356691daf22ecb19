"""A bounded LRU of O_PATH descriptors keyed by file handle.

Resolving a handle (open_by_handle_at, or walking remembered locations) costs several system
calls; the hot path (LOOKUP, GETATTR, OPEN on recently used handles) finds the descriptor here
instead. Users *pin* an entry while they use its descriptor: an entry evicted or discarded while
pinned is closed when its last user releases it, so a descriptor number is never closed (and
reused by the kernel) under a thread that is still using it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict


class Pin:
    """A pinned descriptor: use ``fd`` until ``release`` (or the end of a ``with`` block)."""

    __slots__ = ("_cache", "dead", "fd", "fileid", "key", "pins")

    def __init__(self, cache: FdCache, key: bytes, fd: int, fileid: int) -> None:
        self._cache = cache
        self.key = key
        self.fd = fd
        self.fileid = fileid
        self.pins = 0
        self.dead = False

    def release(self) -> None:
        # (FdCache.release, inlined: every pin of the hot path ends here)
        with self._cache._lock:
            if self.pins < 0:
                return
            self.pins -= 1
            close = self.dead and self.pins == 0
        if close:
            os.close(self.fd)

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cache.release(self)


class FdCache:
    """LRU of descriptors. ``permanent`` entries (the export root) are never evicted."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, Pin] = OrderedDict()
        self._permanent: dict[bytes, Pin] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add_permanent(self, key: bytes, fd: int, fileid: int) -> None:
        with self._lock:
            pin = Pin(self, key, fd, fileid)
            pin.pins = -1  # permanent: never counted, never closed by release
            self._permanent[key] = pin

    def acquire(self, key: bytes) -> Pin | None:
        """Pin the entry for ``key`` (most recently used now), or None."""
        with self._lock:
            pin = self._permanent.get(key)
            if pin is not None:
                return pin
            pin = self._entries.get(key)
            if pin is None:
                return None
            self._entries.move_to_end(key)
            pin.pins += 1
            return pin

    def touch(self, key: bytes) -> bool:
        """Whether ``key`` has an entry (made the most recently used, as ``acquire`` does),
        without pinning it."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return True
            return key in self._permanent

    def insert(self, key: bytes, fd: int, fileid: int) -> Pin:
        """Take ownership of ``fd`` and return it pinned (the existing entry wins a race)."""
        to_close: list[int] = []
        with self._lock:
            pin = self._permanent.get(key) or self._entries.get(key)
            if pin is not None:
                to_close.append(fd)
                if key in self._entries:
                    self._entries.move_to_end(key)
                    pin.pins += 1
            else:
                pin = Pin(self, key, fd, fileid)
                pin.pins = 1
                self._entries[key] = pin
                while len(self._entries) > self.capacity:
                    _, old = self._entries.popitem(last=False)
                    old.dead = True
                    if old.pins == 0:
                        to_close.append(old.fd)
        for f in to_close:
            os.close(f)
        return pin

    def put(self, key: bytes, fd: int, fileid: int) -> None:
        """Take ownership of ``fd`` without keeping it pinned."""
        self.insert(key, fd, fileid).release()

    def release(self, pin: Pin) -> None:
        with self._lock:
            if pin.pins < 0:
                return
            pin.pins -= 1
            close = pin.dead and pin.pins == 0
        if close:
            os.close(pin.fd)

    def discard(self, key: bytes) -> None:
        """Forget ``key`` (its object is gone); closes the descriptor once unpinned."""
        with self._lock:
            pin = self._entries.pop(key, None)
            if pin is None:
                return
            pin.dead = True
            close = pin.pins == 0
        if close:
            os.close(pin.fd)

    def close_all(self) -> None:
        """Shut down: close everything unpinned now, pinned entries on their release."""
        to_close: list[int] = []
        with self._lock:
            for pin in self._entries.values():
                pin.dead = True
                if pin.pins == 0:
                    to_close.append(pin.fd)
            to_close.extend(pin.fd for pin in self._permanent.values())
            self._entries.clear()
            self._permanent.clear()
        for fd in to_close:
            os.close(fd)
