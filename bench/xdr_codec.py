"""XDR codec speed: our generated codecs against the same messages packed and unpacked by hand
with xdrlib3, in the same run.

Messages (each encoded then decoded, RPC header included):
1. a SEQUENCE + PUTFH + READ call;
2. its reply, with 4 KiB of READ data inline;
3. a SEQUENCE + PUTFH + GETATTR reply carrying the 15 attributes the Linux client asks for
   after most operations (attribute values encoded by the server's attribute encoder and
   decoded by the client's).
Both sides must produce identical bytes (checked). Last line: ``ratio_vs_xdrlib3=N.NN``
(xdrlib3 time / our time over the three messages; target >= 3.0).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import xdrlib3
from attr_encode import SAMPLE, linux_getattr_bitmap

from nfsrdma.client.attrs import decode_attrs
from nfsrdma.nfs4.attrs import encode_attrs
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer

SID = bytes(range(16))
FH = bytes(range(40))
STATEID = nfs4.stateid4(1, b"\x07" * 12)
DATA = bytes(range(256)) * 16
CRED = auth_sys(uid=1000, gid=1000, gids=[10, 20], machinename="client.example", stamp=7)
CONFIG = ServerConfig()
BITMAP = linux_getattr_bitmap()
OK = nfs4.NFS4_OK


# -- ours ----------------------------------------------------------------------------------
def ours_call() -> bytes:
    w = Writer()
    message.encode_call(w, 0x1234, 100003, 4, 1, CRED)
    nfs4.enc_COMPOUND4args(
        w,
        nfs4.COMPOUND4args(
            b"",
            1,
            [
                nfs4.nfs_argop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(SID, 5, 3, 7, False)),
                nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(FH)),
                nfs4.nfs_argop4(nfs4.OP_READ, nfs4.READ4args(STATEID, 65536, 4096)),
            ],
        ),
    )
    data = bytes(w)
    r = Reader(data)
    _, _call, off = message.decode_call(r)
    args, _ = nfs4.dec_COMPOUND4args(r, off)
    assert args.argarray[2].value.count == 4096
    return data


def _seq_res() -> nfs4.nfs_resop4:
    return nfs4.nfs_resop4(
        nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(OK, nfs4.SEQUENCE4resok(SID, 5, 3, 63, 63, 0))
    )


def ours_read_reply() -> bytes:
    w = Writer()
    message.encode_accepted(w, 0x1234)
    nfs4.enc_COMPOUND4res(
        w,
        nfs4.COMPOUND4res(
            OK,
            b"",
            [
                _seq_res(),
                nfs4.nfs_resop4(nfs4.OP_PUTFH, nfs4.PUTFH4res(OK)),
                nfs4.nfs_resop4(nfs4.OP_READ, nfs4.READ4res(OK, nfs4.READ4resok(False, DATA))),
            ],
        ),
    )
    data = w.flatten()
    r = Reader(data)
    _, off = message.decode_reply(r)
    res, _ = nfs4.dec_COMPOUND4res(r, off)
    assert len(res.resarray[2].value.value.data) == 4096
    return data


def ours_getattr_reply() -> bytes:
    w = Writer()
    message.encode_accepted(w, 0x1234)
    fattr = encode_attrs(BITMAP, SAMPLE, None, FH, CONFIG)
    nfs4.enc_COMPOUND4res(
        w,
        nfs4.COMPOUND4res(
            OK,
            b"",
            [
                _seq_res(),
                nfs4.nfs_resop4(nfs4.OP_PUTFH, nfs4.PUTFH4res(OK)),
                nfs4.nfs_resop4(nfs4.OP_GETATTR, nfs4.GETATTR4res(OK, nfs4.GETATTR4resok(fattr))),
            ],
        ),
    )
    data = bytes(w)
    r = Reader(data)
    _, off = message.decode_reply(r)
    res, _ = nfs4.dec_COMPOUND4res(r, off)
    values = decode_attrs(res.resarray[2].value.value.obj_attributes)
    assert values[nfs4.FATTR4_SIZE] == SAMPLE.size
    return data


# -- xdrlib3, by hand -------------------------------------------------------------------------
def _x_auth_sys(p: xdrlib3.Packer) -> None:
    body = xdrlib3.Packer()
    body.pack_uint(7)
    body.pack_string(b"client.example")
    body.pack_uint(1000)
    body.pack_uint(1000)
    body.pack_array([10, 20], body.pack_uint)
    p.pack_uint(1)
    p.pack_opaque(body.get_buffer())


def _x_reply_head(p: xdrlib3.Packer) -> None:
    for v in (0x1234, 1, 0, 0):  # xid, REPLY, MSG_ACCEPTED, verf flavor
        p.pack_uint(v)
    p.pack_opaque(b"")
    p.pack_uint(0)  # SUCCESS


def _x_unpack_reply_head(u: xdrlib3.Unpacker) -> None:
    _xid, mtype, stat, _flavor = (u.unpack_uint() for _ in range(4))
    u.unpack_opaque()
    assert (mtype, stat, u.unpack_uint()) == (1, 0, 0)


def _x_seq_res(p: xdrlib3.Packer) -> None:
    p.pack_uint(nfs4.OP_SEQUENCE)
    p.pack_uint(OK)
    p.pack_fopaque(16, SID)
    for v in (5, 3, 63, 63, 0):
        p.pack_uint(v)


def _x_unpack_seq_res(u: xdrlib3.Unpacker) -> None:
    assert u.unpack_uint() == nfs4.OP_SEQUENCE and u.unpack_uint() == OK
    u.unpack_fopaque(16)
    for _ in range(5):
        u.unpack_uint()


def x_call() -> bytes:
    p = xdrlib3.Packer()
    for v in (0x1234, 0, 2, 100003, 4, 1):
        p.pack_uint(v)
    _x_auth_sys(p)
    p.pack_uint(0)
    p.pack_opaque(b"")
    p.pack_opaque(b"")  # tag
    p.pack_uint(1)
    p.pack_uint(3)
    p.pack_uint(nfs4.OP_SEQUENCE)
    p.pack_fopaque(16, SID)
    for v in (5, 3, 7):
        p.pack_uint(v)
    p.pack_bool(False)
    p.pack_uint(nfs4.OP_PUTFH)
    p.pack_opaque(FH)
    p.pack_uint(nfs4.OP_READ)
    p.pack_uint(STATEID.seqid)
    p.pack_fopaque(12, STATEID.other)
    p.pack_uhyper(65536)
    p.pack_uint(4096)
    data = p.get_buffer()
    u = xdrlib3.Unpacker(data)
    for _ in range(6):
        u.unpack_uint()
    u.unpack_uint()
    cred = xdrlib3.Unpacker(u.unpack_opaque())
    cred.unpack_uint()
    cred.unpack_string()
    cred.unpack_uint()
    cred.unpack_uint()
    cred.unpack_array(cred.unpack_uint)
    u.unpack_uint()
    u.unpack_opaque()
    u.unpack_opaque()
    u.unpack_uint()
    n = u.unpack_uint()
    assert n == 3 and u.unpack_uint() == nfs4.OP_SEQUENCE
    u.unpack_fopaque(16)
    for _ in range(3):
        u.unpack_uint()
    u.unpack_bool()
    assert u.unpack_uint() == nfs4.OP_PUTFH
    u.unpack_opaque()
    assert u.unpack_uint() == nfs4.OP_READ
    u.unpack_uint()
    u.unpack_fopaque(12)
    u.unpack_uhyper()
    assert u.unpack_uint() == 4096
    u.done()
    return data


def x_read_reply() -> bytes:
    p = xdrlib3.Packer()
    _x_reply_head(p)
    p.pack_uint(OK)
    p.pack_opaque(b"")
    p.pack_uint(3)
    _x_seq_res(p)
    p.pack_uint(nfs4.OP_PUTFH)
    p.pack_uint(OK)
    p.pack_uint(nfs4.OP_READ)
    p.pack_uint(OK)
    p.pack_bool(False)
    p.pack_opaque(DATA)
    data = p.get_buffer()
    u = xdrlib3.Unpacker(data)
    _x_unpack_reply_head(u)
    u.unpack_uint()
    u.unpack_opaque()
    assert u.unpack_uint() == 3
    _x_unpack_seq_res(u)
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_bool()
    assert len(u.unpack_opaque()) == 4096
    u.done()
    return data


def _x_attrs() -> bytes:
    """The 15 attribute values, in attribute-number order, packed by hand."""
    a = SAMPLE
    p = xdrlib3.Packer()
    p.pack_uint(int(a.type))  # 1 type
    p.pack_uhyper(a.change)  # 3 change
    p.pack_uhyper(a.size)  # 4 size
    p.pack_uhyper(a.fsid[0])  # 8 fsid
    p.pack_uhyper(a.fsid[1])
    p.pack_uhyper(a.fileid)  # 20 fileid
    p.pack_uint(a.mode)  # 33 mode
    p.pack_uint(a.nlink)  # 35 numlinks
    p.pack_string(str(a.uid).encode())  # 36 owner
    p.pack_string(str(a.gid).encode())  # 37 owner_group
    p.pack_uint(a.rdev[0])  # 41 rawdev
    p.pack_uint(a.rdev[1])
    p.pack_uhyper(a.space_used)  # 45 space_used
    for ns in (a.atime_ns, a.ctime_ns, a.mtime_ns):  # 47 access, 52 metadata, 53 modify
        p.pack_hyper(ns // 1_000_000_000)
        p.pack_uint(ns % 1_000_000_000)
    p.pack_uhyper(a.mounted_on_fileid)  # 55 mounted_on_fileid
    return p.get_buffer()


def _x_unpack_attrs(data: bytes) -> dict[str, object]:
    u = xdrlib3.Unpacker(data)
    out: dict[str, object] = {"type": u.unpack_uint(), "change": u.unpack_uhyper()}
    out["size"] = u.unpack_uhyper()
    out["fsid"] = (u.unpack_uhyper(), u.unpack_uhyper())
    out["fileid"] = u.unpack_uhyper()
    out["mode"] = u.unpack_uint()
    out["numlinks"] = u.unpack_uint()
    out["owner"] = u.unpack_string()
    out["group"] = u.unpack_string()
    out["rawdev"] = (u.unpack_uint(), u.unpack_uint())
    out["space_used"] = u.unpack_uhyper()
    for k in ("atime", "ctime", "mtime"):
        out[k] = (u.unpack_hyper(), u.unpack_uint())
    out["mounted_on_fileid"] = u.unpack_uhyper()
    u.done()
    return out


def x_getattr_reply() -> bytes:
    p = xdrlib3.Packer()
    _x_reply_head(p)
    p.pack_uint(OK)
    p.pack_opaque(b"")
    p.pack_uint(3)
    _x_seq_res(p)
    p.pack_uint(nfs4.OP_PUTFH)
    p.pack_uint(OK)
    p.pack_uint(nfs4.OP_GETATTR)
    p.pack_uint(OK)
    p.pack_array(BITMAP, p.pack_uint)
    p.pack_opaque(_x_attrs())
    data = p.get_buffer()
    u = xdrlib3.Unpacker(data)
    _x_unpack_reply_head(u)
    u.unpack_uint()
    u.unpack_opaque()
    assert u.unpack_uint() == 3
    _x_unpack_seq_res(u)
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_uint()
    u.unpack_array(u.unpack_uint)
    assert _x_unpack_attrs(u.unpack_opaque())["size"] == SAMPLE.size
    u.done()
    return data


def best(fn: Callable[[], bytes], n: int, rounds: int = 7) -> float:
    """Best per-call time over several rounds (robust to a busy machine)."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times)


def main() -> int:
    pairs = [
        ("SEQUENCE+PUTFH+READ call", ours_call, x_call),
        ("READ reply (4 KiB inline)", ours_read_reply, x_read_reply),
        ("GETATTR reply (15 attrs)", ours_getattr_reply, x_getattr_reply),
    ]
    total_ours = total_x = 0.0
    print(f"{'message':30} {'ours us':>9} {'xdrlib3 us':>11} {'ratio':>6}")
    for name, ours, theirs in pairs:
        assert ours() == theirs(), f"{name}: the two encodings differ"
        t_ours, t_x = best(ours, 2000), best(theirs, 2000)
        total_ours += t_ours
        total_x += t_x
        print(f"{name:30} {t_ours * 1e6:9.2f} {t_x * 1e6:11.2f} {t_x / t_ours:6.2f}")
    print(f"ratio_vs_xdrlib3={total_x / total_ours:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
