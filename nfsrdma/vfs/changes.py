"""The change attribute: ctime_ns plus a per-file count of the server's own modifications.

ctime has jiffy granularity on tmpfs and older ext4, so two WRITEs in one tick leave it
unchanged; the counter makes each modification the server makes visible. ``change = ctime_ns +
count``: ctime never goes back and the count only grows, so the value never decreases while the
entry is kept; a modification by another process moves ctime by at least one tick, far more than
any realistic count. Read the count *before* ``fstat`` and bump it *after* modifying, so a
GETATTR racing a WRITE can never report the new change value with the old size.

The table is in memory and bounded (least recently bumped entries are dropped); a dropped entry,
like a restart, makes the file's change value fall back to its ctime, which may repeat a value
reported earlier within the same timestamp tick.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

CHANGE_MASK: Final = 0xFFFF_FFFF_FFFF_FFFF  # the change attribute is a uint64 (changeid4)


class ChangeCounter:
    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._counts: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()
        # Bumps of any file so far: unchanged between two reads, the server modified nothing
        # in between (``Resolver.kept_stat``).
        self.generation = 0

    def get(self, fileid: int) -> int:
        return self._counts.get(fileid, 0)

    def bump(self, fileid: int) -> None:
        with self._lock:
            self._counts[fileid] = self._counts.get(fileid, 0) + 1
            self.generation += 1
            self._counts.move_to_end(fileid)
            if len(self._counts) > self.capacity:
                self._counts.popitem(last=False)

    @staticmethod
    def value(ctime_ns: int, count: int) -> int:
        return (ctime_ns + count) & CHANGE_MASK  # (vfs/attrs.py from_stat inlines it)
