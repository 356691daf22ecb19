"""The descriptor LRU: bounded, and never closes a descriptor that is still in use."""

from __future__ import annotations

import os

import pytest

from nfsrdma.vfs.changes import ChangeCounter
from nfsrdma.vfs.fdcache import FdCache


def _fd() -> int:
    return os.open("/", os.O_PATH)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_lru_eviction_closes_unpinned() -> None:
    c = FdCache(2)
    a, b, d = _fd(), _fd(), _fd()
    c.put(b"a", a, 1)
    c.put(b"b", b, 2)
    pin = c.acquire(b"a")  # a becomes most recent
    assert pin is not None
    pin.release()
    c.put(b"d", d, 3)  # evicts b
    assert c.acquire(b"b") is None and not _is_open(b)
    assert len(c) == 2
    c.close_all()
    assert not _is_open(a) and not _is_open(d)


def test_pinned_entries_survive_eviction_until_released() -> None:
    c = FdCache(1)
    a = _fd()
    pin = c.insert(b"a", a, 1)
    c.put(b"b", _fd(), 2)  # evicts a while pinned
    assert _is_open(a)
    assert c.acquire(b"a") is None
    pin.release()
    assert not _is_open(a)
    c.close_all()


def test_discard_and_duplicate_insert() -> None:
    c = FdCache(4)
    a, dup = _fd(), _fd()
    c.put(b"a", a, 1)
    with c.insert(b"a", dup, 1) as pin:  # the existing entry wins; the newcomer is closed
        assert pin.fd == a
    assert not _is_open(dup)
    again = c.acquire(b"a")
    assert again is not None
    c.discard(b"a")
    assert _is_open(a)
    again.release()
    assert not _is_open(a)
    c.close_all()


def test_permanent_entries_are_never_evicted() -> None:
    c = FdCache(1)
    r = _fd()
    c.add_permanent(b"root", r, 1)
    for i in range(3):
        c.put(b"%d" % i, _fd(), i)
    pin = c.acquire(b"root")
    assert pin is not None and pin.fd == r
    pin.release()
    pin.release()
    assert _is_open(r)
    c.close_all()
    assert not _is_open(r)
    with pytest.raises(ValueError):
        FdCache(0)


def test_change_counter_is_bounded_and_counts() -> None:
    cc = ChangeCounter(capacity=2)
    cc.bump(1)
    cc.bump(1)
    cc.bump(2)
    assert (cc.get(1), cc.get(2), cc.get(3)) == (2, 1, 0)
    cc.bump(3)  # drops 1, the least recently bumped
    assert (cc.get(1), cc.get(3)) == (0, 1)
    assert ChangeCounter.value(10, 5) == 15
    assert ChangeCounter.value(2**64 - 1, 1) == 0
