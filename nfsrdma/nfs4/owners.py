"""Owner names to ids through the system's name service (NSS), cached.

A name service lookup (``getpwnam``/``getgrnam``) may go to LDAP, SSSD or a slow NIS server and
blocks whatever thread calls it; the server calls it on its event loop (an owner string in
SETATTR, OPEN or CREATE attributes), so every answer, found or not, is kept for ``TTL`` seconds
and at most ``MAX_ENTRIES`` names are kept, so a client cannot make the loop wait on the same
name twice in that time, nor grow the cache without bound. Ids sent as digits never get here.
"""

from __future__ import annotations

import grp
import pwd
import time
from collections.abc import Callable

TTL = 600.0  # seconds an answer is trusted (a renamed or new account shows up after this)
MAX_ENTRIES = 4096

# (group?, name) -> (id or None when the name is unknown, monotonic time of the lookup)
_cache: dict[tuple[bool, str], tuple[int | None, float]] = {}


def _user(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def _group(name: str) -> int:
    return grp.getgrnam(name).gr_gid


def lookup(name: str, *, group: bool, now: float | None = None) -> int | None:
    """The uid (gid with ``group``) of ``name``, None when the name service does not know it."""
    t = time.monotonic() if now is None else now
    key = (group, name)
    hit = _cache.get(key)
    if hit is not None and t - hit[1] < TTL:
        return hit[0]
    find: Callable[[str], int] = _group if group else _user
    try:
        found: int | None = find(name)
    except (KeyError, UnicodeEncodeError):
        found = None
    if len(_cache) >= MAX_ENTRIES:
        _cache.clear()
    _cache[key] = (found, t)
    return found


def clear() -> None:
    _cache.clear()
