"""Open and byte-range lock state of the NFSv4.1 server (RFC 8881 sections 8 and 9).

Pure data structures: no I/O except closing the VFS ``OpenFile`` objects the opens hold. The
operations (``ops/open_close.py``, ``ops/io.py``, ``ops/locks.py``) validate arguments, talk to
the VFS and call in here; everything runs on the event loop, so no locking is needed.

Stateids
--------
``other`` is 12 octets: 4 octets naming this server instance (random at start-up), then a
64-bit counter. A stateid whose first 4 octets are not ours comes from an earlier instance
(NFS4ERR_STALE_STATEID); one we never issued, or issued to another client, is
NFS4ERR_BAD_STATEID. ``seqid`` starts at 1 and is bumped by every operation that changes the
state (OPEN upgrade, OPEN_DOWNGRADE, LOCK, LOCKU); it wraps from 2**32-1 to 1. A seqid of 0
sent by the client means "the current one"; an older seqid is NFS4ERR_OLD_STATEID, a newer one
NFS4ERR_BAD_STATEID (RFC 8881 section 8.2.2). Delegations live in ``delegations.py`` (their
stateids share the counter); we grant no layouts.

Opens
-----
One :class:`OpenState` per (open-owner, file); repeated OPENs by the owner add their
share_access and share_deny bits (section 9.7), OPEN_DOWNGRADE takes them back to the union of
a subset of those OPENs (section 18.18.3). Share conflicts are checked between different open
owners only.

Locks
-----
One :class:`LockState` per (lock-owner, file), derived from an open of the file (section
9.1.4); its ranges follow POSIX semantics (``state_locks.py``). Locks conflict only between
different lock owners. All of a client's state goes with it (:meth:`StateManager.client_expired`).

Courteous clients
-----------------
A client whose lease ran out while it held state keeps it, *courteous* (``leases``: the session
layer, ``ServerSessions.courteous``; see ``nfsrdma.session.server``). When a request of another
client is refused only by courteous clients' state (a share reservation for OPEN, a byte-range
lock for LOCK and LOCKT, a share deny for I/O with a special stateid and SETATTR of size), those
clients are expired on the spot, all their state released, and the request is granted at once, as
knfsd does. If an active client's state is in the way too, the request is refused and no
courteous client loses anything.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from nfsrdma.nfs4 import state_locks
from nfsrdma.nfs4.context import ANONYMOUS_STATEID, BYPASS_STATEID, Nfs4Error
from nfsrdma.nfs4.delegations import DelegationTable
from nfsrdma.nfs4.state_locks import LockRange
from nfsrdma.vfs.base import OpenFile
from nfsrdma.xdr.gen import nfs4

if TYPE_CHECKING:
    from nfsrdma.nfs4.context import CompoundContext
    from nfsrdma.vfs.base import Vfs

log = logging.getLogger(__name__)

ACCESS_READ: Final = nfs4.OPEN4_SHARE_ACCESS_READ
ACCESS_WRITE: Final = nfs4.OPEN4_SHARE_ACCESS_WRITE
DENY_READ: Final = nfs4.OPEN4_SHARE_DENY_READ
DENY_WRITE: Final = nfs4.OPEN4_SHARE_DENY_WRITE
SEQID_MAX: Final = 0xFFFFFFFF
_ZEROS: Final = bytes(12)
_ONES: Final = b"\xff" * 12
_INSTANCE_LEN: Final = 4
_MAX_WAITERS_PER_FILE: Final = 64

OwnerKey = tuple[int, bytes]  # (client id, owner octets)


def next_seqid(seqid: int) -> int:
    """The seqid after ``seqid`` (0 is never used: it means "current" when sent)."""
    return seqid + 1 if seqid < SEQID_MAX else 1


def is_special(sid: nfs4.stateid4) -> bool:
    """Whether ``other`` is all zeros or all ones (the special stateids of section 8.2.3)."""
    return sid.other in (_ZEROS, _ONES)


def is_anonymous(sid: nfs4.stateid4) -> bool:
    return sid.seqid == ANONYMOUS_STATEID.seqid and sid.other == ANONYMOUS_STATEID.other


def is_bypass(sid: nfs4.stateid4) -> bool:
    return sid.seqid == BYPASS_STATEID.seqid and sid.other == BYPASS_STATEID.other


class Leases(Protocol):
    """What the state layer asks the session layer about clients' leases."""

    def courteous(self, clientid: int) -> bool: ...
    def expire_courteous(self, clientid: int) -> bool: ...


@dataclass(eq=False, slots=True)
class FileState:
    """The state held on one file (keyed by its filehandle, canonical per object)."""

    fh: bytes
    opens: dict[OwnerKey, OpenState] = field(default_factory=dict)
    locks: dict[OwnerKey, LockState] = field(default_factory=dict)

    def lock_ranges(self) -> Iterator[tuple[LockState, LockRange]]:
        for ls in self.locks.values():
            for r in ls.ranges:
                yield ls, r


@dataclass(eq=False, slots=True)
class OpenState:
    """One open-owner's open of one file."""

    other: bytes
    seqid: int
    clientid: int
    owner: bytes
    file: FileState
    access: int
    deny: int
    openfile: OpenFile
    # share_access / share_deny values of the OPENs in effect (OPEN_DOWNGRADE's rule), as
    # bit masks: bit v set when v is one of them (values 0..3)
    access_modes: int = 0
    deny_modes: int = 0
    lock_states: list[LockState] = field(default_factory=list)

    @property
    def key(self) -> OwnerKey:
        return (self.clientid, self.owner)

    @property
    def stateid(self) -> nfs4.stateid4:
        return nfs4.stateid4(self.seqid, self.other)

    def has_locks(self) -> bool:
        return bool(self.lock_states) and any(ls.ranges for ls in self.lock_states)


@dataclass(eq=False, slots=True)
class LockState:
    """One lock-owner's byte-range locks on one file, derived from ``open``."""

    other: bytes
    seqid: int
    clientid: int
    owner: bytes
    file: FileState
    open: OpenState
    ranges: list[LockRange] = field(default_factory=list)

    @property
    def key(self) -> OwnerKey:
        return (self.clientid, self.owner)

    @property
    def stateid(self) -> nfs4.stateid4:
        return nfs4.stateid4(self.seqid, self.other)


State = OpenState | LockState


@dataclass(frozen=True, slots=True)
class Conflict:
    """A lock that refuses a request: the range and its holder (for LOCK4denied)."""

    start: int
    end: int
    kind: int
    clientid: int
    owner: bytes

    def denied(self) -> nfs4.LOCK4denied:
        return nfs4.LOCK4denied(
            offset=self.start,
            length=state_locks.wire_length(self.start, self.end),
            locktype=nfs4.nfs_lock_type4(self.kind),
            owner=nfs4.state_owner4(self.clientid, self.owner),
        )


class StateManager:
    """All open and lock state of one server instance."""

    def __init__(
        self,
        vfs: Vfs | None = None,
        instance: bytes | None = None,
        *,
        max_open_files: int = 1 << 20,
        state_per_client: int = 1 << 20,
    ) -> None:
        self.vfs = vfs
        # Budgets (ServerConfig): opens of all clients (each holds a descriptor), and the
        # stateids (opens, lock stateids) of one client. ``check_room`` enforces them.
        self.max_open_files = max_open_files
        self.state_per_client = state_per_client
        self.open_count = 0
        self._over_budget: set[int] = set()  # clients told NFS4ERR_DELAY (logged once)
        # The counter starts at 1 and never reaches 2**64 - 1, so no stateid we issue can
        # look like a special one, whatever the instance octets are.
        self.instance = (instance or os.urandom(_INSTANCE_LEN))[:_INSTANCE_LEN].ljust(4, b"\0")
        self._counter = 0
        self._states: dict[bytes, State] = {}
        self._files: dict[bytes, FileState] = {}
        self._by_client: dict[int, set[bytes]] = {}
        # Lock-owners refused a blocking lock, by file: when a lock there goes, they are told
        # with CB_NOTIFY_LOCK (section 20.11) instead of polling. The server sets the sender.
        self._waiters: dict[bytes, dict[OwnerKey, None]] = {}
        self.notify_lock: Callable[[int, bytes, bytes], None] | None = None
        # Which clients are courteous, and expiring them (ServerState wires the sessions).
        self.leases: Leases | None = None
        # A delegation may hold two descriptors (its lease's and its closed open's): half as
        # many delegations as open files keep them within the open-file budget.
        self.delegations = DelegationTable(self._new_other, limit=max(1, max_open_files // 2))

    # ------------------------------------------------------------------ stateids

    def _new_other(self) -> bytes:
        self._counter += 1
        return self.instance + self._counter.to_bytes(8, "big")

    def _register(self, state: State) -> None:
        self._states[state.other] = state
        others = self._by_client.get(state.clientid)
        if others is None:
            others = self._by_client[state.clientid] = set()
        others.add(state.other)

    def _unregister(self, state: State) -> None:
        self._states.pop(state.other, None)
        others = self._by_client.get(state.clientid)
        if others is not None:
            others.discard(state.other)
            if not others:
                del self._by_client[state.clientid]

    def find(
        self, clientid: int, sid: nfs4.stateid4, fh: bytes | None, *, check_seqid: bool = True
    ) -> State:
        """The open or lock state ``sid`` names, for ``clientid`` (and the file ``fh``).

        NFS4ERR_BAD_STATEID for special stateids, unknown ones, another client's, or another
        file's; NFS4ERR_STALE_STATEID for an earlier instance's; NFS4ERR_OLD_STATEID for an
        older seqid (section 8.2.2). Special stateids must be dealt with by the caller."""
        state = self._states.get(sid.other)
        if state is None:  # (a special stateid is never one of ours: see _new_other)
            if is_special(sid) or sid.other[:_INSTANCE_LEN] == self.instance:
                raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
            raise Nfs4Error(nfs4.NFS4ERR_STALE_STATEID)
        if state.clientid != clientid:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        if fh is not None and state.file.fh != fh:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        seqid = sid.seqid
        if check_seqid and seqid != state.seqid and seqid != 0:
            check_seqid_of(seqid, state.seqid)
        return state

    def find_open(self, clientid: int, sid: nfs4.stateid4, fh: bytes | None) -> OpenState:
        state = self.find(clientid, sid, fh)
        if not isinstance(state, OpenState):
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        return state

    def find_lock(self, clientid: int, sid: nfs4.stateid4, fh: bytes | None) -> LockState:
        state = self.find(clientid, sid, fh)
        if not isinstance(state, LockState):
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        return state

    def find_delegation(self, clientid: int, sid: nfs4.stateid4, fh: bytes | None = None) -> None:
        """Check that ``sid`` is a live delegation of ``clientid`` (on ``fh``):
        NFS4ERR_STALE_STATEID if it comes from an earlier instance, NFS4ERR_DELEG_REVOKED once
        revoked, NFS4ERR_BAD_STATEID otherwise."""
        if is_special(sid):
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        if self.delegations.get(sid.other) is not None:
            self.delegations.find(clientid, sid, fh)
            return
        if sid.other[:_INSTANCE_LEN] != self.instance and sid.other not in self._states:
            raise Nfs4Error(nfs4.NFS4ERR_STALE_STATEID)
        raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)

    def test_stateid(self, clientid: int, sid: nfs4.stateid4) -> int:
        """TEST_STATEID's status for one stateid (RFC 8881 section 18.48.3)."""
        delegated = self.delegations.test(clientid, sid)
        if delegated is not None:
            return delegated
        try:
            self.find(clientid, sid, None)
        except Nfs4Error as e:
            if e.status == nfs4.NFS4ERR_OLD_STATEID:
                return nfs4.NFS4ERR_OLD_STATEID
            return nfs4.NFS4ERR_BAD_STATEID
        return nfs4.NFS4_OK

    def free_stateid(self, clientid: int, sid: nfs4.stateid4) -> None:
        """FREE_STATEID (section 18.38): only a lock stateid without locks can go; an open
        stateid, or a lock stateid still holding locks, is NFS4ERR_LOCKS_HELD. A revoked
        delegation stateid goes; a live one is NFS4ERR_LOCKS_HELD (DELEGRETURN it)."""
        if self.delegations.free(clientid, sid):
            return
        state = self.find(clientid, sid, None, check_seqid=False)
        if isinstance(state, OpenState) or state.ranges:
            raise Nfs4Error(nfs4.NFS4ERR_LOCKS_HELD)
        self._drop_lock_state(state)

    # ------------------------------------------------------------------ files

    def _file(self, fh: bytes) -> FileState:
        f = self._files.get(fh)
        if f is None:
            f = self._files[fh] = FileState(fh)
        return f

    def _maybe_forget_file(self, f: FileState) -> None:
        if not f.opens and not f.locks:
            self._files.pop(f.fh, None)

    def open_files(self, fh: bytes) -> list[OpenFile]:
        """The open files (any client) of ``fh``, writable ones first (for COMMIT)."""
        f = self._files.get(fh)
        if f is None:
            return []
        files = [o.openfile for o in f.opens.values()]
        files.sort(key=lambda of: not of.writable)
        return files

    # ------------------------------------------------------------------ opens

    def open_of(self, clientid: int, owner: bytes, fh: bytes) -> OpenState | None:
        f = self._files.get(fh)
        return None if f is None else f.opens.get((clientid, owner))

    def check_share(self, fh: bytes, access: int, deny: int, mine: OpenState | None) -> None:
        """NFS4ERR_SHARE_DENIED if another open-owner's open of ``fh`` denies ``access`` or
        holds access that ``deny`` would deny (section 9.7)."""
        f = self._files.get(fh)
        if f is None:
            return
        holders: set[int] | None = None
        for o in f.opens.values():
            if o is not mine and ((access & o.deny) or (deny & o.access)):
                if holders is None:
                    holders = set()
                holders.add(o.clientid)
        if holders is not None and not self.make_way(holders):
            raise Nfs4Error(nfs4.NFS4ERR_SHARE_DENIED)

    def check_room(self, clientid: int, opening: bool) -> None:
        """Before a new open (``opening``) or lock stateid of ``clientid``: NFS4ERR_DELAY when
        the client holds its share of stateids, or when an open would pass the server's
        open-file budget. Descriptors are a resource of the whole process: without this, one
        client opening files could leave the server unable to accept connections or open
        files for anyone. The client gets room back by closing (or freeing) state."""
        held = len(self._by_client.get(clientid, ()))
        if held < self.state_per_client and not (
            opening and self.open_count >= self.max_open_files
        ):
            if self._over_budget:
                self._over_budget.discard(clientid)
            return
        if clientid not in self._over_budget:
            self._over_budget.add(clientid)
            log.warning(
                "client %#x: %s (%d stateids held, %d of %d open files in use): NFS4ERR_DELAY",
                clientid,
                "holds its share of state" if held >= self.state_per_client else "no room",
                held,
                self.open_count,
                self.max_open_files,
            )
        raise Nfs4Error(nfs4.NFS4ERR_DELAY)

    def make_way(self, holders: set[int]) -> bool:
        """The clients ``holders`` hold state refusing a request: if all of them are
        courteous, expire them (their state goes) and return True; else False, and nothing
        changes."""
        leases = self.leases
        if leases is None or not all(leases.courteous(c) for c in holders):
            return False
        for clientid in holders:
            leases.expire_courteous(clientid)
            self.client_expired(clientid)  # done by the expiry already, when wired
        log.info("courteous clients %s expired: their state refused a request", holders)
        return True

    def add_open(
        self,
        clientid: int,
        owner: bytes,
        fh: bytes,
        access: int,
        deny: int,
        openfile: OpenFile,
    ) -> OpenState:
        """A new open (the caller checked share conflicts and that none exists)."""
        f = self._file(fh)
        key = (clientid, owner)
        assert key not in f.opens, "open exists: use upgrade_open"
        state = OpenState(  # (positional: cheaper than keywords)
            self._new_other(),
            1,  # seqid
            clientid,
            owner,
            f,
            access,
            deny,
            openfile,
            1 << access,  # access_modes
            1 << deny,  # deny_modes
        )
        f.opens[key] = state
        self._register(state)
        self.open_count += 1
        return state

    def upgrade_open(
        self, state: OpenState, access: int, deny: int, openfile: OpenFile | None
    ) -> None:
        """A further OPEN by the same owner: union of the share bits, next seqid; ``openfile``
        (if given) replaces the open's file, which is closed."""
        state.access |= access
        state.deny |= deny
        state.access_modes |= 1 << access
        state.deny_modes |= 1 << deny
        if openfile is not None and openfile is not state.openfile:
            old, state.openfile = state.openfile, openfile
            _close_quietly(old)
        state.seqid = next_seqid(state.seqid)

    def downgrade_open(self, state: OpenState, access: int, deny: int) -> None:
        """OPEN_DOWNGRADE (section 18.18.3): ``access``/``deny`` must each be the union of the
        values of some of the OPENs in effect, else NFS4ERR_INVAL."""
        if not _union_of_subset(access, state.access_modes) or not _union_of_subset(
            deny, state.deny_modes
        ):
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)
        state.access = access
        state.deny = deny
        state.access_modes = _within(state.access_modes, access) | 1 << access
        state.deny_modes = _within(state.deny_modes, deny) | 1 << deny
        state.seqid = next_seqid(state.seqid)

    def close_open(self, state: OpenState) -> None:
        """CLOSE (section 18.2.3): NFS4ERR_LOCKS_HELD while any lock derived from the open
        is held; otherwise the open and its (empty) lock stateids go."""
        if state.has_locks():
            raise Nfs4Error(nfs4.NFS4ERR_LOCKS_HELD)
        self._drop_open(state)

    def _drop_open(self, state: OpenState) -> None:
        if state.lock_states:
            for ls in list(state.lock_states):
                self._drop_lock_state(ls)
        f = state.file
        key = (state.clientid, state.owner)
        if f.opens.get(key) is state:
            del f.opens[key]
            self.open_count -= 1
        self._unregister(state)
        _close_quietly(state.openfile)
        self._maybe_forget_file(f)

    # ------------------------------------------------------------------ locks

    def lock_state_of(self, clientid: int, owner: bytes, fh: bytes) -> LockState | None:
        f = self._files.get(fh)
        return None if f is None else f.locks.get((clientid, owner))

    def find_conflict(
        self, fh: bytes, key: OwnerKey, start: int, end: int, kind: int
    ) -> Conflict | None:
        """The first lock of another lock-owner on ``fh`` that refuses this one."""
        f = self._files.get(fh)
        if f is None:
            return None
        found: tuple[LockState, LockRange] | None = None
        holders: set[int] = set()
        for ls, r in f.lock_ranges():
            if ls.key == key or not r.conflicts(start, end, kind):
                continue
            holders.add(ls.clientid)
            if found is None or r.start < found[1].start:
                found = (ls, r)
        if found is None or self.make_way(holders):
            return None
        ls, r = found
        return Conflict(r.start, r.end, r.kind, ls.clientid, ls.owner)

    def take_shared_lock(
        self, of: OpenFile, key: OwnerKey, start: int, end: int, kind: int
    ) -> Conflict | None:
        """Take the lock in a file system shared with other servers too (``Vfs.lock``); the
        lock held through another server that refuses it, if any."""
        if self.vfs is None:
            return None
        held = self.vfs.lock(of, lock_owner_id(key), start, end, kind == state_locks.WRITE)
        return None if held is None else _elsewhere(held)

    def test_shared_lock(
        self, fh: bytes, key: OwnerKey, start: int, end: int, kind: int
    ) -> Conflict | None:
        """LOCKT's question to a file system shared with other servers (``Vfs.test_lock``)."""
        if self.vfs is None:
            return None
        held = self.vfs.test_lock(fh, lock_owner_id(key), start, end, kind == state_locks.WRITE)
        return None if held is None else _elsewhere(held)

    def new_lock_state(self, open_state: OpenState, owner: bytes) -> LockState:
        """The lock stateid of (lock-owner, file), created from ``open_state`` if needed
        (open_to_lock_owner4); an existing one is reused, whatever open it came from."""
        f = open_state.file
        key = (open_state.clientid, owner)
        existing = f.locks.get(key)
        if existing is not None:
            return existing
        ls = LockState(
            other=self._new_other(),
            seqid=0,  # bumped to 1 by the LOCK that creates it
            clientid=open_state.clientid,
            owner=owner,
            file=f,
            open=open_state,
        )
        f.locks[key] = ls
        open_state.lock_states.append(ls)
        self._register(ls)
        return ls

    def set_lock(self, ls: LockState, start: int, end: int, kind: int) -> None:
        """Lock ``[start, end)`` for ``ls``'s owner (the caller checked conflicts)."""
        held = ls.ranges
        ls.ranges = state_locks.lock(ls.ranges, start, end, kind)
        ls.seqid = next_seqid(ls.seqid)
        waiters = self._waiters.get(ls.file.fh)
        if waiters:
            waiters.pop(ls.key, None)
        if held and kind == state_locks.READ:
            self._released(ls.file.fh)  # a downgrade may let readers in

    def unlock(self, ls: LockState, start: int, end: int) -> None:
        if self.vfs is not None and ls.ranges:
            self.vfs.unlock(ls.open.openfile, lock_owner_id(ls.key), start, end)
        ls.ranges = state_locks.unlock(ls.ranges, start, end)
        ls.seqid = next_seqid(ls.seqid)
        self._released(ls.file.fh)

    def add_waiter(self, fh: bytes, key: OwnerKey) -> bool:
        """A blocking lock (READW_LT/WRITEW_LT) was refused: remember to notify its owner.
        True when notifications will be sent (then OPEN says OPEN4_RESULT_MAY_NOTIFY_LOCK)."""
        if self.notify_lock is None:
            return False
        waiters = self._waiters.setdefault(fh, {})
        if len(waiters) < _MAX_WAITERS_PER_FILE:
            waiters[key] = None
        return True

    @property
    def notifies_locks(self) -> bool:
        return self.notify_lock is not None

    def _released(self, fh: bytes) -> None:
        waiters = self._waiters.pop(fh, None)
        if waiters and self.notify_lock is not None:
            for clientid, owner in waiters:
                self.notify_lock(clientid, fh, owner)

    def _drop_lock_state(self, ls: LockState) -> None:
        if ls.ranges:
            if self.vfs is not None:
                self.vfs.unlock(ls.open.openfile, lock_owner_id(ls.key), 0, state_locks.TO_EOF)
            ls.ranges = []
            self._released(ls.file.fh)
        f = ls.file
        if f.locks.get(ls.key) is ls:
            del f.locks[ls.key]
        if ls in ls.open.lock_states:
            ls.open.lock_states.remove(ls)
        self._unregister(ls)
        self._maybe_forget_file(f)

    # ------------------------------------------------------------------ I/O checks

    def check_special(self, fh: bytes, write: bool) -> None:
        """I/O with the anonymous stateid (or a WRITE with the READ-bypass one): refused
        with NFS4ERR_LOCKED when an open of the file denies that access (section 9.7)."""
        f = self._files.get(fh)
        if f is None:
            return
        bit = DENY_WRITE if write else DENY_READ
        holders = {o.clientid for o in f.opens.values() if o.deny & bit}
        if holders and not self.make_way(holders):
            raise Nfs4Error(nfs4.NFS4ERR_LOCKED)

    def io_file(self, clientid: int, sid: nfs4.stateid4, fh: bytes, write: bool) -> OpenFile | None:
        """The open file a READ or WRITE with ``sid`` goes through, or ``None`` for the
        special stateids (anonymous I/O with the caller's credential). NFS4ERR_OPENMODE when
        the open does not allow the access."""
        other = sid.other
        if other in (_ZEROS, _ONES) and (is_anonymous(sid) or is_bypass(sid)):
            if write or not is_bypass(sid):
                self.check_special(fh, write)
            return None
        deleg = self.delegations.get(other)
        if deleg is not None:
            return self._delegated_io(clientid, sid, fh, write)
        state = self.find(clientid, sid, fh)
        open_state = state.open if isinstance(state, LockState) else state
        of = open_state.openfile
        if write:
            if not (open_state.access & ACCESS_WRITE) or not of.writable:
                raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)
        elif not of.readable:
            raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)
        return of

    def _delegated_io(
        self, clientid: int, sid: nfs4.stateid4, fh: bytes, write: bool
    ) -> OpenFile | None:
        """I/O with a delegation stateid (section 8.2.1): through one of the client's opens of
        the file that allows it, else through the open file the delegation kept from a
        closed open, else with the caller's credential (as anonymous I/O);
        writing under a read delegation is NFS4ERR_OPENMODE."""
        deleg = self.delegations.find(clientid, sid, fh)
        if write and not deleg.write:
            raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)
        f = self._files.get(fh)
        for o in f.opens.values() if f is not None else ():
            if o.clientid == clientid and (o.openfile.writable if write else o.openfile.readable):
                return o.openfile
        held = deleg.file  # a delegation outliving its open: the open's file, kept
        if held is not None and (held.writable if write else held.readable):
            return held
        return None

    def check_setattr_size(self, ctx: CompoundContext, stateid: nfs4.stateid4, fh: bytes) -> None:
        """SETATTR of size with ``stateid`` (section 18.30.3): an open or lock stateid of this
        client and file whose open allows writing (NFS4ERR_OPENMODE otherwise), or a special
        stateid, subject to other opens' share_deny (NFS4ERR_LOCKED)."""
        sid = ctx.resolve_stateid(stateid)
        if is_anonymous(sid) or is_bypass(sid):
            self.check_special(fh, write=True)
            return
        if self.delegations.get(sid.other) is not None:
            if not self.delegations.find(ctx.clientid, sid, fh).write:
                raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)
            return
        state = self.find(ctx.clientid, sid, fh)
        open_state = state.open if isinstance(state, LockState) else state
        if not open_state.access & ACCESS_WRITE:
            raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)

    # ------------------------------------------------------------------ clients

    def client_has_state(self, clientid: int) -> bool:
        return bool(self._by_client.get(clientid)) or self.delegations.client_has(clientid)

    def client_expired(self, clientid: int) -> None:
        """Release everything the client holds: its locks, its opens (closing the files), its
        delegations."""
        self.delegations.purge(clientid)
        others = self._by_client.get(clientid)
        if not others:
            return
        states = [self._states[o] for o in list(others) if o in self._states]
        for s in states:
            if isinstance(s, LockState):
                self._drop_lock_state(s)
        for s in states:
            if isinstance(s, OpenState):
                self._drop_open(s)
        self._by_client.pop(clientid, None)
        self._over_budget.discard(clientid)
        log.debug("client %#x: %d stateids released", clientid, len(states))

    def close(self) -> None:
        """Server shutdown: close every open file."""
        self.notify_lock = None
        self.delegations.close()
        for clientid in list(self._by_client):
            self.client_expired(clientid)

    @property
    def stateid_count(self) -> int:
        return len(self._states)


def lock_owner_id(key: OwnerKey) -> int:
    """A 64-bit id of a lock-owner (client ID, owner) for the file system's own locks."""
    clientid, owner = key
    digest = hashlib.blake2b(clientid.to_bytes(8, "big") + owner, digest_size=8).digest()
    return int.from_bytes(digest, "big")


# The holder of a lock taken through another server is not known here (LOCK4denied owner).
_ELSEWHERE_OWNER: Final = b"lock held through another server"


def _elsewhere(held: tuple[int, int, bool]) -> Conflict:
    start, end, write = held
    kind = state_locks.WRITE if write else state_locks.READ
    return Conflict(start, end, kind, 0, _ELSEWHERE_OWNER)


def check_seqid_of(sent: int, current: int) -> None:
    """Section 8.2.2: 0 means current; older → OLD_STATEID; newer → BAD_STATEID."""
    if sent == 0 or sent == current:
        return
    if (current - sent) & SEQID_MAX < 0x80000000:
        raise Nfs4Error(nfs4.NFS4ERR_OLD_STATEID)
    raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)


def _within(mask: int, value: int) -> int:
    """The values of the mode mask ``mask`` that are subsets of ``value``, as a mask."""
    kept = 0
    for v in range(4):
        if mask >> v & 1 and v & ~value == 0:
            kept |= 1 << v
    return kept


def _union_of_subset(value: int, modes: int) -> bool:
    """Whether ``value`` is the union of some of the values in the mode mask ``modes`` (0 is
    the empty union)."""
    union = 0
    for v in range(4):
        if modes >> v & 1 and v & ~value == 0:
            union |= v
    return union == value


def _close_quietly(of: OpenFile) -> None:
    try:
        of.close()
    except OSError as e:  # pragma: no cover - close of a descriptor rarely fails
        log.warning("closing an open file failed: %s", e)
