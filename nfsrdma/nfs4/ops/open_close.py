"""OPEN, OPEN_DOWNGRADE, CLOSE, DELEGRETURN and DELEGPURGE (RFC 8881 sections 18.16, 18.18,
18.2, 18.6, 18.5).

Delegations are granted on OPEN by ``delegation_service.py`` (read and write; recalled on
conflicts); CLAIM_DELEGATE_CUR / CLAIM_DELEG_CUR_FH turn opens made under a delegation into
opens. After a restart, opens are reclaimed with CLAIM_PREVIOUS (the current filehandle names
the file) under the rules of ``nfsrdma.nfs4.grace``, which also refuses other OPENs in the grace
period; CLAIM_DELEGATE_PREV / CLAIM_DELEG_PREV_FH and DELEGPURGE get NFS4ERR_NOTSUPP (section
18.5.3: a server without CLAIM_DELEGATE_PREV returns that). OPEN is synchronous: it runs on the
event loop from the share check to the state update, so two OPENs of one file never interleave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nfsrdma.nfs4 import grace
from nfsrdma.nfs4.attrs import (
    MODE_BITS,
    SUPPATTR_EXCLCREAT,
    Settable,
    attr_numbers,
    bitmap_of,
    decode_settable,
)
from nfsrdma.nfs4.context import INVALID_STATEID, CompoundContext, Nfs4Error
from nfsrdma.nfs4.delegation_service import check_conflicts, check_name, open_conflict_write
from nfsrdma.nfs4.ops.lookup import check_component
from nfsrdma.nfs4.state import ACCESS_READ, ACCESS_WRITE, OpenState, StateManager
from nfsrdma.vfs.base import CreateMode, FileType, OpenFile
from nfsrdma.xdr.gen import nfs4

DEFAULT_CREATE_MODE: Final = 0o644  # createattrs without a mode
_ACCESS_BITS: Final = nfs4.OPEN4_SHARE_ACCESS_BOTH
_WANT_MASK: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_DELEG_MASK
_WANT_FLAGS: Final = (
    nfs4.OPEN4_SHARE_ACCESS_WANT_SIGNAL_DELEG_WHEN_RESRC_AVAIL
    | nfs4.OPEN4_SHARE_ACCESS_WANT_PUSH_DELEG_WHEN_UNCONTENDED
)
_RFLAGS: Final = nfs4.OPEN4_RESULT_LOCKTYPE_POSIX
_RFLAGS_NOTIFY: Final = _RFLAGS | nfs4.OPEN4_RESULT_MAY_NOTIFY_LOCK  # (CB_NOTIFY_LOCK sent)
_WANTS: Final = frozenset(
    {
        nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE,
        nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG,
        nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG,
        nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG,
        nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
        nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL,
    }
)


# ---------------------------------------------------------------- argument checks


def share_args(share_access: int, share_deny: int) -> tuple[int, int, int]:
    """``(access, deny, want)`` of OPEN's share words; NFS4ERR_INVAL for values outside
    RFC 8881 section 18.16.3 (no access bit, unknown low bits or want value, deny > BOTH).
    Unknown flag bits above the want byte (later minor versions) are ignored."""
    access = share_access & _ACCESS_BITS
    want = share_access & _WANT_MASK
    stray = share_access & 0xFF & ~_ACCESS_BITS
    if not access or stray or want not in _WANTS or share_deny & ~nfs4.OPEN4_SHARE_DENY_BOTH:
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    return access, share_deny, want


def check_regular(ftype: int) -> None:
    """OPEN of something that is not a regular file: NFS4ERR_ISDIR for a directory,
    NFS4ERR_SYMLINK for a symbolic link and (as knfsd, which the Linux client expects) for
    the other types."""
    if ftype == FileType.NF4REG:
        return
    if ftype == FileType.NF4DIR:
        raise Nfs4Error(nfs4.NFS4ERR_ISDIR)
    raise Nfs4Error(nfs4.NFS4ERR_SYMLINK)


def check_directory(ftype: int) -> None:
    """The current filehandle of a CLAIM_NULL OPEN must be a directory."""
    if ftype == FileType.NF4DIR:
        return
    if ftype == FileType.NF4LNK:
        raise Nfs4Error(nfs4.NFS4ERR_SYMLINK)
    raise Nfs4Error(nfs4.NFS4ERR_NOTDIR)


# Results that never vary (encoded at once, never changed: shared by every reply)
_NO_DELEGATION: Final = nfs4.open_delegation4(nfs4.OPEN_DELEGATE_NONE)
_CLOSED: Final = nfs4.CLOSE4res(nfs4.NFS4_OK, INVALID_STATEID)


def no_delegation(want: int) -> nfs4.open_delegation4:
    """We never delegate; say why when the client expressed a want (section 18.16.3)."""
    if want == nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE:
        return _NO_DELEGATION
    if want == nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG:
        why = nfs4.open_none_delegation4(nfs4.WND4_NOT_WANTED)
    elif want == nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL:
        why = nfs4.open_none_delegation4(nfs4.WND4_CANCELLED)
    else:
        why = nfs4.open_none_delegation4(nfs4.WND4_CONTENTION, False)
    return nfs4.open_delegation4(nfs4.OPEN_DELEGATE_NONE_EXT, why)


# ---------------------------------------------------------------- OPEN


@dataclass(slots=True)
class _Target:
    """The file an OPEN resolved to."""

    fh: bytes
    openfile: OpenFile | None = None  # opened for this OPEN's access (create path)
    created: bool = False
    truncate: bool = False  # UNCHECKED4 of an existing file with size 0 in createattrs
    attrset: list[int] | None = None


def _covers(of: OpenFile, access: int) -> bool:
    return (not access & ACCESS_READ or of.readable) and (not access & ACCESS_WRITE or of.writable)


_MODE_ONLY: Final = tuple(bitmap_of([nfs4.FATTR4_MODE]))
assert nfs4.FATTR4_MODE in SUPPATTR_EXCLCREAT


def createattrs(fattr: nfs4.fattr4) -> tuple[Settable, bool]:
    """``decode_settable`` of OPEN's createattrs, and whether they are the mode alone (which
    an exclusive create may set): the Linux client's createattrs, decoded in place, else by
    ``decode_settable`` (the reference: ``tests/unit/nfs4/test_open_createattrs.py``)."""
    vals = fattr.attr_vals
    if len(vals) == 4 and tuple(fattr.attrmask) == _MODE_ONLY:
        mode = int.from_bytes(vals, "big")
        if not mode & ~MODE_BITS:
            return Settable(mode=mode, attrset=list(_MODE_ONLY)), True
    return decode_settable(fattr), False


def _create_how(how: nfs4.createhow4) -> tuple[Settable, CreateMode, bytes | None]:
    """OPEN's createhow4: its createattrs, the VFS's create mode and the verifier."""
    if how.mode in (nfs4.UNCHECKED4, nfs4.GUARDED4):
        assert isinstance(how.value, nfs4.fattr4)
        settable = createattrs(how.value)[0]
        return (
            settable,
            CreateMode.UNCHECKED if how.mode == nfs4.UNCHECKED4 else CreateMode.GUARDED,
            None,
        )
    if how.mode == nfs4.EXCLUSIVE4_1:
        assert isinstance(how.value, nfs4.creatverfattr)
        settable, mode_only = createattrs(how.value.cva_attrs)
        if not mode_only and any(
            n not in SUPPATTR_EXCLCREAT for n in attr_numbers(settable.attrset)
        ):
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)
        return settable, CreateMode.EXCLUSIVE, how.value.cva_verf
    # EXCLUSIVE4 is NFSv4.0's; a 4.1 client uses EXCLUSIVE4_1 (section 18.16.3)
    raise Nfs4Error(nfs4.NFS4ERR_INVAL)


def _create(
    ctx: CompoundContext, dir_fh: bytes, name: bytes, how: nfs4.createhow4, access: int
) -> tuple[_Target, int, int]:
    """The create of a CLAIM_NULL OPEN, and the directory's change before and after it; the
    directory's checks (stale, then not a directory) come before the createattrs'."""
    vfs = ctx.server.vfs
    try:
        settable, mode, verifier = _create_how(how)
    except Nfs4Error:
        vfs.change(dir_fh)  # (a removed directory: stale, first)
        check_directory(vfs.file_type(dir_fh))
        raise
    perm = DEFAULT_CREATE_MODE if settable.mode is None else settable.mode
    try:
        before, fh, of, created, after = vfs.create_changed(
            ctx.cred,
            dir_fh,
            name,
            perm,
            mode,
            verifier,
            read=bool(access & ACCESS_READ),
            write=bool(access & ACCESS_WRITE),
        )
    except NotADirectoryError:
        check_directory(vfs.file_type(dir_fh))  # (NFS4ERR_SYMLINK for a symlink)
        raise
    target = _Target(fh, of, created)
    if created:
        try:
            _apply_createattrs(ctx, fh, settable)
        except BaseException:
            of.close()
            raise
        target.attrset = list(settable.attrset)
    elif settable.size == 0:
        target.truncate = True
    return target, before, after


def _apply_createattrs(ctx: CompoundContext, fh: bytes, s: Settable) -> None:
    """The createattrs the create itself did not set (mode went to create_file)."""
    if s.uid is None and s.gid is None and not s.size and s.atime is None and s.mtime is None:
        return
    ctx.server.vfs.setattr(
        ctx.cred,
        fh,
        uid=s.uid,
        gid=s.gid,
        size=s.size or None,
        atime=s.atime,
        mtime=s.mtime,
    )


def _resolve(ctx: CompoundContext, args: nfs4.OPEN4args, access: int) -> tuple[_Target, int, int]:
    """The target of the OPEN, and the parent directory's change before/after (0, 0 when
    the claim names the file itself)."""
    claim = args.claim
    vfs = ctx.server.vfs
    creating = args.openhow.opentype == nfs4.OPEN4_CREATE
    if claim.claim == nfs4.CLAIM_NULL:
        dir_fh = ctx.fh()
        assert isinstance(claim.value, bytes)
        name = check_component(claim.value)
        if not creating:
            # The directory's change (a removed directory: stale, first), its type, the name's
            # object and its type, in one VFS call (a removed file: stale at the open).
            try:
                before, fh, ftype = vfs.open_lookup(ctx.cred, dir_fh, name)
            except NotADirectoryError:
                check_directory(vfs.file_type(dir_fh))  # (NFS4ERR_SYMLINK for a symlink)
                raise
            check_regular(ftype)
            return _Target(fh), before, before
        assert isinstance(args.openhow.value, nfs4.createhow4)
        # The create path opens an existing file at once. (Before the directory's checks: a
        # name it cannot look up, in a removed directory or a file, concerns no delegation.)
        check_name(ctx, dir_fh, name, local_write=bool(access & ACCESS_WRITE), local_open=True)
        return _create(ctx, dir_fh, name, args.openhow.value, access)
    if claim.claim == nfs4.CLAIM_FH:
        fh = ctx.fh()
        if creating:
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)
        check_regular(vfs.getattr(fh).type)
        return _Target(fh), 0, 0
    if claim.claim == nfs4.CLAIM_PREVIOUS:
        # A reclaim after our restart (grace.check_locking allowed it): the file itself.
        fh = ctx.fh()
        if creating:
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)
        check_regular(vfs.getattr(fh).type)
        return _Target(fh), 0, 0
    if claim.claim in (nfs4.CLAIM_DELEGATE_CUR, nfs4.CLAIM_DELEG_CUR_FH):
        # An open the client made locally under its delegation, told to us (section 10.4.3).
        fh = ctx.fh()
        if creating:
            raise Nfs4Error(nfs4.NFS4ERR_INVAL)
        if isinstance(claim.value, nfs4.open_claim_delegate_cur4):
            deleg = claim.value.delegate_stateid
            name = check_component(claim.value.file)
            check_directory(vfs.getattr(fh).type)
            fh = vfs.lookup(ctx.cred, fh, name)
        else:
            assert isinstance(claim.value, nfs4.stateid4)
            deleg = claim.value
        ctx.server.state_manager.find_delegation(ctx.clientid, ctx.resolve_stateid(deleg), fh)
        check_regular(vfs.getattr(fh).type)
        return _Target(fh), 0, 0
    # CLAIM_DELEGATE_PREV, CLAIM_DELEG_PREV_FH: no delegations survive a client restart here.
    raise Nfs4Error(nfs4.NFS4ERR_NOTSUPP)


def op_open(ctx: CompoundContext, args: nfs4.OPEN4args) -> nfs4.OPEN4res:
    access, deny, want = share_args(args.share_access, args.share_deny)
    reclaim = args.claim.claim == nfs4.CLAIM_PREVIOUS
    grace.check_locking(ctx, reclaim)
    clientid = ctx.clientid
    sm: StateManager = ctx.server.state_manager
    sm.check_room(clientid, opening=True)  # before anything is created
    vfs = ctx.server.vfs
    target, before, after = _resolve(ctx, args, access)
    fh = target.fh
    fresh = target.openfile  # the OpenFile this OPEN made, until the state owns it
    keep: OpenFile | None = None
    try:
        check_conflicts(
            ctx,
            fh,
            write=open_conflict_write(access, deny, target.truncate),
            local_write=bool(access & ACCESS_WRITE) or target.truncate,
            local_open=True,
        )
        existing = sm.open_of(clientid, args.owner.owner, fh)
        union = access | (existing.access if existing else 0)
        sm.check_share(fh, union, deny | (existing.deny if existing else 0), existing)
        if target.truncate and not union & ACCESS_WRITE:
            sm.check_share(fh, ACCESS_WRITE, 0, existing)
        if fresh is None:  # also the permission check of this OPEN's access
            fresh = vfs.open(
                ctx.cred, fh, read=bool(access & ACCESS_READ), write=bool(access & ACCESS_WRITE)
            )
        if existing is not None and _covers(existing.openfile, union):
            keep = None
        elif _covers(fresh, union):
            keep = fresh
        else:
            keep = vfs.open(
                ctx.cred, fh, read=bool(union & ACCESS_READ), write=bool(union & ACCESS_WRITE)
            )
        if target.truncate:
            vfs.setattr(ctx.cred, fh, size=0)
            target.attrset = bitmap_of([nfs4.FATTR4_SIZE])
    except BaseException:
        for of in (fresh, keep):
            if of is not None:
                of.close()
        raise
    if fresh is not keep:
        fresh.close()
    state: OpenState
    if existing is not None:
        sm.upgrade_open(existing, access, deny, keep)
        state = existing
    else:
        assert keep is not None
        state = sm.add_open(clientid, args.owner.owner, fh, access, deny, keep)
    grace.opened(ctx, reclaim)
    ctx.set_fh(fh)
    ctx.current_stateid = stateid = nfs4.stateid4(state.seqid, state.other)
    return nfs4.OPEN4res(
        nfs4.NFS4_OK,
        nfs4.OPEN4resok(
            stateid,
            nfs4.change_info4(False, before, after),
            _RFLAGS_NOTIFY if sm.notify_lock is not None else _RFLAGS,
            target.attrset or [],
            _delegation(ctx, sm, state, want, created=target.created),
        ),
    )


def _delegation(
    ctx: CompoundContext, sm: StateManager, state: OpenState, want: int, *, created: bool
) -> nfs4.open_delegation4:
    service = ctx.server.delegation_service
    if service is None:
        return no_delegation(want)
    return service.offer(ctx, sm, state, want, created=created)


# ---------------------------------------------------------------- OPEN_DOWNGRADE, CLOSE


def op_open_downgrade(
    ctx: CompoundContext, args: nfs4.OPEN_DOWNGRADE4args
) -> nfs4.OPEN_DOWNGRADE4res:
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.open_stateid)
    sm: StateManager = ctx.server.state_manager
    state = sm.find_open(ctx.clientid, sid, fh)
    access = args.share_access & ~(_WANT_MASK | _WANT_FLAGS)
    deny = args.share_deny
    if (
        access & ~_ACCESS_BITS
        or not access
        or deny & ~nfs4.OPEN4_SHARE_DENY_BOTH
        or access & ~state.access
        or deny & ~state.deny
    ):
        raise Nfs4Error(nfs4.NFS4ERR_INVAL)
    sm.downgrade_open(state, access, deny)
    ctx.current_stateid = state.stateid
    return nfs4.OPEN_DOWNGRADE4res(nfs4.NFS4_OK, nfs4.OPEN_DOWNGRADE4resok(state.stateid))


def op_close(ctx: CompoundContext, args: nfs4.CLOSE4args) -> nfs4.CLOSE4res:
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.open_stateid)
    sm: StateManager = ctx.server.state_manager
    sm.close_open(sm.find_open(ctx.clientid, sid, fh))
    # The stateid CLOSE returns is useless to the client: NFSv4.1 servers return the
    # special invalid stateid (RFC 8881 section 18.2.4).
    ctx.current_stateid = INVALID_STATEID
    return _CLOSED


# ---------------------------------------------------------------- delegations


def op_delegreturn(ctx: CompoundContext, args: nfs4.DELEGRETURN4args) -> nfs4.DELEGRETURN4res:
    """DELEGRETURN (section 18.6): the delegation goes, with its kernel lease; a revoked one is
    NFS4ERR_DELEG_REVOKED (the client frees it with FREE_STATEID)."""
    fh = ctx.fh()
    sid = ctx.resolve_stateid(args.deleg_stateid)
    sm: StateManager = ctx.server.state_manager
    sm.find_delegation(ctx.clientid, sid, fh)
    sm.delegations.delegreturn(ctx.clientid, sid, fh)
    return nfs4.DELEGRETURN4res(nfs4.NFS4_OK)


def op_delegpurge(ctx: CompoundContext, args: nfs4.DELEGPURGE4args) -> nfs4.DELEGPURGE4res:
    # Only meaningful with CLAIM_DELEGATE_PREV, which we do not support (section 18.5.3).
    raise Nfs4Error(nfs4.NFS4ERR_NOTSUPP)
