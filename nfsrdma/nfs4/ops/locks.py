"""LOCK, LOCKT, LOCKU (RFC 8881 sections 18.10-18.12), TEST_STATEID and FREE_STATEID
(sections 18.48, 18.38).

Byte-range locks are held by the server (advisory, POSIX semantics, see ``state_locks.py``),
and also taken in the file system when it is shared with other servers (``Vfs.lock``: CephFS).
The blocking lock types are answered like the others, NFS4ERR_DENIED with the conflicting lock;
the refused lock-owner is then told by CB_NOTIFY_LOCK when a lock on the file goes, so it can
retry at once (OPEN said OPEN4_RESULT_MAY_NOTIFY_LOCK; RFC 8881 section 20.11). Lock seqids
are ignored; a LOCK with ``reclaim`` set re-creates a lock after our restart, under the rules of
``nfsrdma.nfs4.grace`` (which also refuses other LOCKs in the grace period).
"""

from __future__ import annotations

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.context import CompoundContext, Nfs4Error
from nfsrdma.nfs4.state import ACCESS_READ, ACCESS_WRITE, LockState, OpenState, StateManager
from nfsrdma.nfs4.state_locks import READ, byte_range, lock_kind
from nfsrdma.vfs.base import FileType
from nfsrdma.xdr.gen import nfs4


def op_lock(ctx: CompoundContext, args: nfs4.LOCK4args) -> nfs4.LOCK4res:
    fh = ctx.fh()
    kind = lock_kind(args.locktype)
    start, end = byte_range(args.offset, args.length)
    grace.check_locking(ctx, args.reclaim)
    clientid = ctx.clientid
    sm: StateManager = ctx.server.state_manager
    locker = args.locker
    open_state: OpenState
    ls: LockState | None
    if locker.new_lock_owner:
        assert isinstance(locker.value, nfs4.open_to_lock_owner4)
        sid = ctx.resolve_stateid(locker.value.open_stateid)
        open_state = sm.find_open(clientid, sid, fh)
        owner = locker.value.lock_owner.owner
        ls = sm.lock_state_of(clientid, owner, fh)
        if ls is None:
            sm.check_room(clientid, opening=False)  # before any lock is taken
    else:
        assert isinstance(locker.value, nfs4.exist_lock_owner4)
        sid = ctx.resolve_stateid(locker.value.lock_stateid)
        ls = sm.find_lock(clientid, sid, fh)
        open_state, owner = ls.open, ls.owner
    # A read lock needs an open for reading, a write lock one for writing (18.10.4).
    needed = ACCESS_READ if kind == READ else ACCESS_WRITE
    if not open_state.access & needed:
        raise Nfs4Error(nfs4.NFS4ERR_OPENMODE)
    conflict = sm.find_conflict(fh, (clientid, owner), start, end, kind)
    if conflict is None:  # and none through another server in front of the same file system
        conflict = sm.take_shared_lock(open_state.openfile, (clientid, owner), start, end, kind)
    if conflict is not None:
        if args.locktype in (nfs4.READW_LT, nfs4.WRITEW_LT):
            sm.add_waiter(fh, (clientid, owner))  # told by CB_NOTIFY_LOCK when it may retry
        denied = conflict.denied()
        raise Nfs4Error(nfs4.NFS4ERR_DENIED, nfs4.LOCK4res(nfs4.NFS4ERR_DENIED, denied))
    if ls is None:
        ls = sm.new_lock_state(open_state, owner)
    sm.set_lock(ls, start, end, kind)
    grace.locked(ctx, args.reclaim)
    ctx.current_stateid = ls.stateid
    return nfs4.LOCK4res(nfs4.NFS4_OK, nfs4.LOCK4resok(ls.stateid))


def op_lockt(ctx: CompoundContext, args: nfs4.LOCKT4args) -> nfs4.LOCKT4res:
    fh = ctx.fh()
    kind = lock_kind(args.locktype)
    start, end = byte_range(args.offset, args.length)
    clientid = ctx.clientid
    ftype = ctx.server.vfs.getattr(fh).type
    if ftype == FileType.NF4DIR:
        raise Nfs4Error(nfs4.NFS4ERR_ISDIR)
    if ftype != FileType.NF4REG:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    sm: StateManager = ctx.server.state_manager
    key = (clientid, args.owner.owner)
    conflict = sm.find_conflict(fh, key, start, end, kind)
    if conflict is None:
        conflict = sm.test_shared_lock(fh, key, start, end, kind)
    if conflict is not None:
        denied = conflict.denied()
        raise Nfs4Error(nfs4.NFS4ERR_DENIED, nfs4.LOCKT4res(nfs4.NFS4ERR_DENIED, denied))
    return nfs4.LOCKT4res(nfs4.NFS4_OK)


def op_locku(ctx: CompoundContext, args: nfs4.LOCKU4args) -> nfs4.LOCKU4res:
    fh = ctx.fh()
    lock_kind(args.locktype)
    start, end = byte_range(args.offset, args.length)
    sid = ctx.resolve_stateid(args.lock_stateid)
    sm: StateManager = ctx.server.state_manager
    ls = sm.find_lock(ctx.clientid, sid, fh)
    sm.unlock(ls, start, end)
    ctx.current_stateid = ls.stateid
    return nfs4.LOCKU4res(nfs4.NFS4_OK, ls.stateid)


def op_test_stateid(ctx: CompoundContext, args: nfs4.TEST_STATEID4args) -> nfs4.TEST_STATEID4res:
    clientid = ctx.clientid
    sm: StateManager = ctx.server.state_manager
    codes = [nfs4.nfsstat4(sm.test_stateid(clientid, sid)) for sid in args.ts_stateids]
    return nfs4.TEST_STATEID4res(nfs4.NFS4_OK, nfs4.TEST_STATEID4resok(codes))


def op_free_stateid(ctx: CompoundContext, args: nfs4.FREE_STATEID4args) -> nfs4.FREE_STATEID4res:
    sid = ctx.resolve_stateid(args.fsa_stateid)
    ctx.server.state_manager.free_stateid(ctx.clientid, sid)
    return nfs4.FREE_STATEID4res(nfs4.NFS4_OK)
