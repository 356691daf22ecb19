"""The operation table: each module in this package is one family of operations; here every
implemented operation is bound to its generated ``Operation`` (number, codecs, types), so mypy
checks each handler's argument and result types against the specification. Operations not in
the table get NFS4ERR_NOTSUPP (which is also the answer NFSv4.1 requires for the NFSv4.0-only
operations)."""

from __future__ import annotations

from typing import Any

from nfsrdma.nfs4.context import Bound, bind
from nfsrdma.nfs4.ops import (
    attributes,
    copy,
    directory,
    filehandle,
    io,
    locks,
    lookup,
    namespace,
    open_close,
    session_ops,
    sparse,
    xattr,
)
from nfsrdma.xdr.gen import nfs4

# Not annotated: each entry keeps its own types, so a handler bound to the wrong operation is a
# type error.
_BOUND = (
    # session_ops: RFC 8881 sections 18.33-18.37, 18.46, 18.50, 18.51
    bind(nfs4.OPERATION_EXCHANGE_ID, session_ops.exchange_id),
    bind(nfs4.OPERATION_CREATE_SESSION, session_ops.create_session),
    bind(nfs4.OPERATION_SEQUENCE, session_ops.sequence),
    bind(nfs4.OPERATION_BIND_CONN_TO_SESSION, session_ops.bind_conn_to_session),
    bind(nfs4.OPERATION_DESTROY_SESSION, session_ops.destroy_session),
    bind(nfs4.OPERATION_DESTROY_CLIENTID, session_ops.destroy_clientid),
    bind(nfs4.OPERATION_RECLAIM_COMPLETE, session_ops.reclaim_complete),
    bind(nfs4.OPERATION_BACKCHANNEL_CTL, session_ops.backchannel_ctl),
    # filehandle
    bind(nfs4.OPERATION_PUTROOTFH, filehandle.putrootfh),
    bind(nfs4.OPERATION_PUTPUBFH, filehandle.putpubfh),
    bind(nfs4.OPERATION_PUTFH, filehandle.putfh),
    bind(nfs4.OPERATION_GETFH, filehandle.getfh),
    bind(nfs4.OPERATION_SAVEFH, filehandle.savefh),
    bind(nfs4.OPERATION_RESTOREFH, filehandle.restorefh),
    # lookup
    bind(nfs4.OPERATION_LOOKUP, lookup.lookup),
    bind(nfs4.OPERATION_LOOKUPP, lookup.lookupp),
    bind(nfs4.OPERATION_SECINFO, lookup.secinfo),
    bind(nfs4.OPERATION_SECINFO_NO_NAME, lookup.secinfo_no_name),
    # attributes
    bind(nfs4.OPERATION_GETATTR, attributes.getattr_),
    bind(nfs4.OPERATION_SETATTR, attributes.setattr_),
    bind(nfs4.OPERATION_VERIFY, attributes.verify),
    bind(nfs4.OPERATION_NVERIFY, attributes.nverify),
    bind(nfs4.OPERATION_ACCESS, attributes.access),
    # directory
    bind(nfs4.OPERATION_READDIR, directory.readdir),
    # namespace
    bind(nfs4.OPERATION_CREATE, namespace.create),
    bind(nfs4.OPERATION_REMOVE, namespace.remove),
    bind(nfs4.OPERATION_RENAME, namespace.rename),
    bind(nfs4.OPERATION_LINK, namespace.link),
    bind(nfs4.OPERATION_READLINK, namespace.readlink),
    # open_close
    bind(nfs4.OPERATION_OPEN, open_close.op_open),
    bind(nfs4.OPERATION_OPEN_DOWNGRADE, open_close.op_open_downgrade),
    bind(nfs4.OPERATION_CLOSE, open_close.op_close),
    bind(nfs4.OPERATION_DELEGRETURN, open_close.op_delegreturn),
    bind(nfs4.OPERATION_DELEGPURGE, open_close.op_delegpurge),
    # io
    bind(nfs4.OPERATION_READ, io.op_read),
    bind(nfs4.OPERATION_WRITE, io.op_write),
    bind(nfs4.OPERATION_COMMIT, io.op_commit),
    # locks
    bind(nfs4.OPERATION_LOCK, locks.op_lock),
    bind(nfs4.OPERATION_LOCKT, locks.op_lockt),
    bind(nfs4.OPERATION_LOCKU, locks.op_locku),
    bind(nfs4.OPERATION_TEST_STATEID, locks.op_test_stateid),
    bind(nfs4.OPERATION_FREE_STATEID, locks.op_free_stateid),
    # NFSv4.2 (RFC 7862; minor version 2 COMPOUNDs only, see compound.py)
    bind(nfs4.OPERATION_SEEK, sparse.op_seek),
    bind(nfs4.OPERATION_READ_PLUS, sparse.op_read_plus),
    bind(nfs4.OPERATION_ALLOCATE, sparse.op_allocate),
    bind(nfs4.OPERATION_DEALLOCATE, sparse.op_deallocate),
    bind(nfs4.OPERATION_COPY, copy.op_copy),
    bind(nfs4.OPERATION_OFFLOAD_STATUS, copy.op_offload_status),
    bind(nfs4.OPERATION_OFFLOAD_CANCEL, copy.op_offload_cancel),
    bind(nfs4.OPERATION_CLONE, copy.op_clone),
    # extended attributes (RFC 8276)
    bind(nfs4.OPERATION_GETXATTR, xattr.op_getxattr),
    bind(nfs4.OPERATION_SETXATTR, xattr.op_setxattr),
    bind(nfs4.OPERATION_LISTXATTRS, xattr.op_listxattrs),
    bind(nfs4.OPERATION_REMOVEXATTR, xattr.op_removexattr),
)


def _table(bound: tuple[Bound[Any, Any], ...]) -> dict[int, Bound[Any, Any]]:
    table: dict[int, Bound[Any, Any]] = {}
    for b in bound:
        if b.op.number in table:
            raise RuntimeError(f"{b.op.name} has two handlers")
        table[b.op.number] = b
    return table


HANDLERS: dict[int, Bound[Any, Any]] = _table(_BOUND)
"""Implemented operations by number (a table of different operations: their types are checked
where each is bound, above)."""
