"""Key protocol numbers and shapes of the parsed .x specifications, pinned to their RFCs.

rpc.x follows RFC 5531, rpcrdma.x RFC 8166, nfs4.x RFC 5662 (NFSv4.1). A typo in a
specification silently changes the generated codecs; these facts catch the costly ones.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

import nfsrdma.xdr
from nfsrdma.xdr.ast import Enum_, Kind, Spec, Struct
from nfsrdma.xdr.parser import parse

SPECS = Path(nfsrdma.xdr.__file__).parent / "specs"


@cache
def spec(name: str) -> Spec:
    return parse((SPECS / f"{name}.x").read_text(encoding="utf-8"))


def enum_members(name: str, typ: str) -> dict[str, int]:
    e = spec(name).types[typ]
    assert isinstance(e, Enum_)
    return dict(e.members)


def fields(name: str, typ: str) -> list[tuple[str, str, Kind, int | None]]:
    s = spec(name).types[typ]
    assert isinstance(s, Struct)
    return [(f.name, f.type, f.kind, f.size) for f in s.fields]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # RFC 5662: operation numbers
        ("OP_ACCESS", 3),
        ("OP_READ", 25),
        ("OP_WRITE", 38),
        ("OP_RELEASE_LOCKOWNER", 39),
        ("OP_BACKCHANNEL_CTL", 40),
        ("OP_EXCHANGE_ID", 42),
        ("OP_CREATE_SESSION", 43),
        ("OP_SEQUENCE", 53),
        ("OP_RECLAIM_COMPLETE", 58),
        ("OP_ILLEGAL", 10044),
        # RFC 5662: callback operation numbers
        ("OP_CB_GETATTR", 3),
        ("OP_CB_RECALL", 4),
        ("OP_CB_SEQUENCE", 11),
        ("OP_CB_NOTIFY_DEVICEID", 14),
        ("OP_CB_ILLEGAL", 10044),
        # RFC 5662: status codes
        ("NFS4_OK", 0),
        ("NFS4ERR_STALE", 70),
        ("NFS4ERR_BADHANDLE", 10001),
        ("NFS4ERR_DELAY", 10008),
        ("NFS4ERR_OP_ILLEGAL", 10044),
        ("NFS4ERR_BADSESSION", 10052),
        ("NFS4ERR_SEQ_MISORDERED", 10063),
        ("NFS4ERR_HASH_ALG_UNSUPP", 10072),
        ("NFS4ERR_CLIENTID_BUSY", 10074),
        ("NFS4ERR_BAD_HIGH_SLOT", 10077),
        ("NFS4ERR_DEADSESSION", 10078),
        ("NFS4ERR_DELEG_REVOKED", 10087),
        # RFC 5662: attribute numbers
        ("FATTR4_SUPPORTED_ATTRS", 0),
        ("FATTR4_FILEHANDLE", 19),
        ("FATTR4_MOUNTED_ON_FILEID", 55),
        ("FATTR4_FS_LOCATIONS_INFO", 67),
        ("FATTR4_MODE_SET_MASKED", 74),
        ("FATTR4_SUPPATTR_EXCLCREAT", 75),
        ("FATTR4_FS_CHARSET_CAP", 76),
        # RFC 5662: sizes, flags and other numbers
        ("NFS4_FHSIZE", 128),
        ("NFS4_VERIFIER_SIZE", 8),
        ("NFS4_OPAQUE_LIMIT", 1024),
        ("NFS4_SESSIONID_SIZE", 16),
        ("NFS4_DEVICEID4_SIZE", 16),
        ("NFS4_UINT64_MAX", 0xFFFFFFFFFFFFFFFF),
        ("NFS4_MAXFILEOFF", 0xFFFFFFFFFFFFFFFE),
        ("EXCHGID4_FLAG_USE_PNFS_MDS", 0x00020000),
        ("EXCHGID4_FLAG_CONFIRMED_R", 0x80000000),
        ("CREATE_SESSION4_FLAG_CONN_RDMA", 0x00000004),
        ("SEQ4_STATUS_DEVID_DELETED", 0x00001000),
        ("OPEN4_SHARE_ACCESS_WANT_PUSH_DELEG_WHEN_UNCONTENDED", 0x20000),
        ("ACE4_GENERIC_WRITE", 0x00160106),
        ("LAYOUTRECALL4_ALL", 3),
        ("CLAIM_DELEG_PREV_FH", 6),
        ("CDFC4_BACK_OR_BOTH", 0x7),
        ("RPCSEC_GSS", 6),
    ],
)
def test_nfs4_numbers(name: str, value: int) -> None:
    assert spec("nfs4").constants[name] == value


def test_nfs4_enumerations_are_complete() -> None:
    ops = enum_members("nfs4", "nfs_opnum4")
    # OP_ACCESS (3) .. OP_RECLAIM_COMPLETE (58), NFSv4.2's OP_ALLOCATE (59) .. OP_CLONE (71)
    # and RFC 8276's OP_GETXATTR (72) .. OP_REMOVEXATTR (75), no gaps, plus OP_ILLEGAL.
    assert len(ops) == 74
    assert sorted(ops.values()) == [*range(3, 76), 10044]
    assert ops["OP_SEEK"] == 69 and ops["OP_CLONE"] == 71 and ops["OP_REMOVEXATTR"] == 75
    cb_ops = enum_members("nfs4", "nfs_cb_opnum4")
    assert sorted(cb_ops.values()) == [*range(3, 16), 10044]  # CB_OFFLOAD is 15
    status = enum_members("nfs4", "nfsstat4")
    assert len(status) == 113
    # 19 (an NFSv3 meaning), 10002 and 10073 are never allocated.
    assert {19, 10002, 10073}.isdisjoint(status.values())
    assert set(range(10049, 10097)) - set(status.values()) == {10073}
    assert status["NFS4ERR_OFFLOAD_NO_REQS"] == 10094 and status["NFS4ERR_XATTR2BIG"] == 10096
    fattr = {n: v for n, v in spec("nfs4").constants.items() if n.startswith("FATTR4_")}
    # 0 .. 80 each once; 81 (mode_umask, RFC 8275) is not defined here; 82 is xattr_support.
    assert sorted(fattr.values()) == [*range(81), 82]


def test_nfs4_programs() -> None:
    progs = {p.name: p for p in spec("nfs4").programs}
    nfs = progs["NFS4_PROGRAM"]
    assert nfs.number == 100003
    assert [(v.name, v.number) for v in nfs.versions] == [("NFS_V4", 4)]
    procs = [(p.name, p.number, p.result, p.args) for p in nfs.versions[0].procedures]
    assert procs == [
        ("NFSPROC4_NULL", 0, "void", []),
        ("NFSPROC4_COMPOUND", 1, "COMPOUND4res", ["COMPOUND4args"]),
    ]
    cb = progs["NFS4_CALLBACK"]
    assert cb.number == 0x40000000
    assert [(v.name, v.number) for v in cb.versions] == [("NFS_CB", 1)]
    procs = [(p.name, p.number, p.result, p.args) for p in cb.versions[0].procedures]
    assert procs == [
        ("CB_NULL", 0, "void", []),
        ("CB_COMPOUND", 1, "CB_COMPOUND4res", ["CB_COMPOUND4args"]),
    ]


def test_nfs4_session_shapes() -> None:
    assert fields("nfs4", "SEQUENCE4args") == [
        ("sa_sessionid", "sessionid4", Kind.PLAIN, None),
        ("sa_sequenceid", "sequenceid4", Kind.PLAIN, None),
        ("sa_slotid", "slotid4", Kind.PLAIN, None),
        ("sa_highest_slotid", "slotid4", Kind.PLAIN, None),
        ("sa_cachethis", "bool", Kind.PLAIN, None),
    ]
    assert [f[0] for f in fields("nfs4", "channel_attrs4")] == [
        "ca_headerpadsize",
        "ca_maxrequestsize",
        "ca_maxresponsesize",
        "ca_maxresponsesize_cached",
        "ca_maxoperations",
        "ca_maxrequests",
        "ca_rdma_ird",
    ]
    assert fields("nfs4", "channel_attrs4")[-1] == ("ca_rdma_ird", "uint32_t", Kind.VARIABLE, 1)
    assert fields("nfs4", "stateid4") == [
        ("seqid", "uint32_t", Kind.PLAIN, None),
        ("other", "opaque", Kind.FIXED, 12),
    ]
    # READDIR's entry list keeps the RFC's linked-list shape.
    assert fields("nfs4", "entry4")[-1] == ("nextentry", "entry4", Kind.OPTIONAL, None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RDMA_MSG", 0),
        ("RDMA_NOMSG", 1),
        ("RDMA_MSGP", 2),
        ("RDMA_DONE", 3),
        ("RDMA_ERROR", 4),
        ("ERR_VERS", 1),
        ("ERR_CHUNK", 2),
    ],
)
def test_rpcrdma_numbers(name: str, value: int) -> None:
    assert spec("rpcrdma").constants[name] == value


def test_rpcrdma_shapes() -> None:
    assert fields("rpcrdma", "xdr_rdma_segment") == [
        ("handle", "uint32", Kind.PLAIN, None),
        ("length", "uint32", Kind.PLAIN, None),
        ("offset", "uint64", Kind.PLAIN, None),
    ]
    assert [f[0] for f in fields("rpcrdma", "rdma_msg")] == [
        "rdma_xid",
        "rdma_vers",
        "rdma_credit",
        "rdma_body",
    ]
    assert fields("rpcrdma", "xdr_read_list")[-1] == ("next", "xdr_read_list", Kind.OPTIONAL, None)
    assert fields("rpcrdma", "xdr_write_list")[-1] == (
        "next",
        "xdr_write_list",
        Kind.OPTIONAL,
        None,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CALL", 0),
        ("REPLY", 1),
        ("MSG_DENIED", 1),
        ("SYSTEM_ERR", 5),
        ("AUTH_ERROR", 1),
        ("AUTH_NONE", 0),
        ("AUTH_SYS", 1),
        ("AUTH_SHORT", 2),
        ("AUTH_DH", 3),
        ("RPCSEC_GSS", 6),
        ("AUTH_TOOWEAK", 5),
        ("AUTH_NET_ADDR", 12),
        ("RPCSEC_GSS_CREDPROBLEM", 13),
        ("RPCSEC_GSS_CTXPROBLEM", 14),
    ],
)
def test_rpc_numbers(name: str, value: int) -> None:
    assert spec("rpc").constants[name] == value


def test_rpc_shapes() -> None:
    assert fields("rpc", "opaque_auth")[1] == ("body", "opaque", Kind.VARIABLE, 400)
    assert fields("rpc", "authsys_parms") == [
        ("stamp", "unsigned int", Kind.PLAIN, None),
        ("machinename", "string", Kind.VARIABLE, 255),
        ("uid", "unsigned int", Kind.PLAIN, None),
        ("gid", "unsigned int", Kind.PLAIN, None),
        ("gids", "unsigned int", Kind.VARIABLE, 16),
    ]
    assert len(enum_members("rpc", "auth_stat")) == 15  # AUTH_OK .. RPCSEC_GSS_CTXPROBLEM
