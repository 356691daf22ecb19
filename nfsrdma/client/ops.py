"""Operation builders: each returns one ``nfs_argop4`` for a COMPOUND (RFC 5662 names), and
``results`` checks a COMPOUND4res."""

from __future__ import annotations

from typing import Any

from nfsrdma.client.attrs import encode_attrs, encode_bitmap
from nfsrdma.client.errors import nfs_error
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Buffer

ANONYMOUS_STATEID = nfs4.stateid4(0, bytes(12))
ALL_ONES = 0xFFFFFFFFFFFFFFFF
Op = nfs4.nfs_argop4


def putrootfh() -> Op:
    return Op(nfs4.OP_PUTROOTFH)


def putfh(fh: bytes) -> Op:
    return Op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))


def getfh() -> Op:
    return Op(nfs4.OP_GETFH)


def savefh() -> Op:
    return Op(nfs4.OP_SAVEFH)


def restorefh() -> Op:
    return Op(nfs4.OP_RESTOREFH)


def lookup(name: bytes) -> Op:
    return Op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name))


def getattr_(bits: tuple[int, ...] | list[int]) -> Op:
    return Op(nfs4.OP_GETATTR, nfs4.GETATTR4args(encode_bitmap(bits)))


def setattr_(values: dict[int, Any], stateid: nfs4.stateid4 = ANONYMOUS_STATEID) -> Op:
    return Op(nfs4.OP_SETATTR, nfs4.SETATTR4args(stateid, encode_attrs(values)))


def read(stateid: nfs4.stateid4, offset: int, count: int) -> Op:
    return Op(nfs4.OP_READ, nfs4.READ4args(stateid, offset, count))


def write(stateid: nfs4.stateid4, offset: int, data: Buffer, stable: int) -> Op:
    return Op(nfs4.OP_WRITE, nfs4.WRITE4args(stateid, offset, nfs4.stable_how4(stable), data))


def commit(offset: int = 0, count: int = 0) -> Op:
    return Op(nfs4.OP_COMMIT, nfs4.COMMIT4args(offset, count))


def remove(name: bytes) -> Op:
    return Op(nfs4.OP_REMOVE, nfs4.REMOVE4args(name))


def rename(old: bytes, new: bytes) -> Op:
    return Op(nfs4.OP_RENAME, nfs4.RENAME4args(old, new))


def link(name: bytes) -> Op:
    return Op(nfs4.OP_LINK, nfs4.LINK4args(name))


def readlink() -> Op:
    return Op(nfs4.OP_READLINK)


def create(ftype: int, name: bytes, attrs: dict[int, Any], linkdata: bytes = b"") -> Op:
    objtype = nfs4.createtype4(nfs4.nfs_ftype4(ftype), linkdata if ftype == nfs4.NF4LNK else None)
    return Op(nfs4.OP_CREATE, nfs4.CREATE4args(objtype, name, encode_attrs(attrs)))


def readdir(cookie: int, verf: bytes, dircount: int, maxcount: int, bits: tuple[int, ...]) -> Op:
    return Op(
        nfs4.OP_READDIR,
        nfs4.READDIR4args(cookie, verf, dircount, maxcount, encode_bitmap(bits)),
    )


def open_(
    owner: nfs4.state_owner4,
    access: int,
    name: bytes | None,
    *,
    create: int | None = None,
    attrs: dict[int, Any] | None = None,
    claim_previous: bool = False,
) -> Op:
    """OPEN by name in the current directory (CLAIM_NULL), of the current file (CLAIM_FH when
    ``name`` is None) or a reclaim after a server restart (CLAIM_PREVIOUS). ``create`` is a
    createmode4 (UNCHECKED4 / GUARDED4) or None for no creation."""
    if create is None:
        how = nfs4.openflag4(nfs4.OPEN4_NOCREATE)
    else:
        how = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.createmode4(create), encode_attrs(attrs or {})),
        )
    if claim_previous:
        claim = nfs4.open_claim4(nfs4.CLAIM_PREVIOUS, nfs4.OPEN_DELEGATE_NONE)
    elif name is None:
        claim = nfs4.open_claim4(nfs4.CLAIM_FH)
    else:
        claim = nfs4.open_claim4(nfs4.CLAIM_NULL, name)
    return Op(
        nfs4.OP_OPEN,
        nfs4.OPEN4args(0, access, nfs4.OPEN4_SHARE_DENY_NONE, owner, how, claim),
    )


def close(stateid: nfs4.stateid4) -> Op:
    return Op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, stateid))


def lock(
    locktype: int,
    offset: int,
    length: int,
    *,
    open_stateid: nfs4.stateid4 | None = None,
    lock_owner: nfs4.state_owner4 | None = None,
    lock_stateid: nfs4.stateid4 | None = None,
    reclaim: bool = False,
) -> Op:
    if lock_stateid is not None:
        locker = nfs4.locker4(False, nfs4.exist_lock_owner4(lock_stateid, 0))
    else:
        assert open_stateid is not None and lock_owner is not None
        locker = nfs4.locker4(True, nfs4.open_to_lock_owner4(0, open_stateid, 0, lock_owner))
    return Op(
        nfs4.OP_LOCK,
        nfs4.LOCK4args(nfs4.nfs_lock_type4(locktype), reclaim, offset, length, locker),
    )


def locku(locktype: int, stateid: nfs4.stateid4, offset: int, length: int) -> Op:
    return Op(
        nfs4.OP_LOCKU,
        nfs4.LOCKU4args(nfs4.nfs_lock_type4(locktype), 0, stateid, offset, length),
    )


def results(res: nfs4.COMPOUND4res, op: str = "", path: str | None = None) -> list[Any]:
    """The result values of a successful COMPOUND (``resok`` of each operation, or the result
    itself for operations without one); raises the NfsError of a failed one."""
    if res.status != nfs4.NFS4_OK:
        raise nfs_error(res.status, op or _failed_op(res), path)
    return [getattr(r.value, "value", r.value) for r in res.resarray]


def _failed_op(res: nfs4.COMPOUND4res) -> str:
    if not res.resarray:
        return ""
    try:
        return nfs4.nfs_opnum4(res.resarray[-1].resop).name.removeprefix("OP_")
    except ValueError:
        return ""


def failed_index(res: nfs4.COMPOUND4res) -> int:
    """Index of the failing operation (len(resarray) - 1 when the COMPOUND failed)."""
    return len(res.resarray) - 1
