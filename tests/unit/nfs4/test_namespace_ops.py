"""Filehandle, lookup, attribute, directory and namespace operations against the real local VFS.

Each operation's arguments go through the generated XDR encoder and decoder before the handler
sees them (so DDP-eligible items arrive as memoryviews, as from a transport), and each result
is encoded and decoded back, so the tests see what a client would. A COMPOUND stops at the
first error, as in nfsrdma.nfs4.compound. End-to-end COMPOUNDs through ``compound()`` with a
real session are at the end of the file.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
import stat
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from nfsrdma.nfs4 import attrs
from nfsrdma.nfs4.context import ANONYMOUS_STATEID, CompoundContext
from nfsrdma.nfs4.errors import status_of
from nfsrdma.nfs4.ops import HANDLERS
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.auth import Credential
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.tcp import TcpConnection, connect_tcp
from nfsrdma.vfs import Cred, Export, LocalVfs
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.nfs4_fattr import MASKS
from nfsrdma.xdr.runtime import Reader, Writer, pack

ROOT = Cred(0, 0, ())
U1000 = Cred(1000, 1000, ())
OK = nfs4.NFS4_OK
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")
pytestmark = needs_root


# ---------------------------------------------------------------- harness


@dataclass
class Reply:
    status: int
    results: list[Any]
    ctx: CompoundContext

    def __getitem__(self, i: int) -> Any:
        return self.results[i]

    @property
    def last(self) -> Any:
        return self.results[-1]


async def _awaited(pending: Awaitable[Any]) -> Any:
    return await pending


class Server:
    def __init__(self, vfs: LocalVfs, config: ServerConfig | None = None) -> None:
        self.vfs = vfs
        self.state = ServerState(config or ServerConfig(), vfs, cast(Any, None), StateManager(vfs))
        self.awaited = 0  # handler outcomes that had to be awaited (READDIR in the pool)

    def context(self, cred: Cred = ROOT) -> CompoundContext:
        return CompoundContext(
            server=self.state,
            cred=cred,
            principal=Credential(rpc.AUTH_SYS, cred.uid, cred.gid, cred.gids),
            conn=RpcConnection(TcpConnection("test:0")),
            now=0.0,
        )

    def run(self, *ops: tuple[int, Any], cred: Cred = ROOT) -> Reply:
        ctx = self.context(cred)
        return self.run_in(ctx, *ops)

    def run_in(self, ctx: CompoundContext, *ops: tuple[int, Any]) -> Reply:
        results: list[Any] = []
        status: int = OK
        for op, args in ops:
            wire = pack(nfs4.enc_nfs_argop4, nfs4.nfs_argop4(nfs4.nfs_opnum4(op), args))
            argop, _ = nfs4.dec_nfs_argop4(Reader(wire), 0)
            try:
                res = HANDLERS[op].handler(ctx, argop.value)
                if inspect.isawaitable(res):
                    # Only a READDIR with more entries than readdir_inline goes on in the
                    # thread pool; every other namespace handler answers at once.
                    assert op == nfs4.OP_READDIR, f"{op}: namespace handlers are synchronous"
                    self.awaited += 1
                    res = asyncio.run(_awaited(res))
            except Exception as e:
                st = status_of(e)
                assert st != nfs4.NFS4ERR_SERVERFAULT, f"{op}: server fault {e!r}"
                res = getattr(e, "result", None) or nfs4.OPERATIONS[op].error(st)
            encoded = pack(nfs4.enc_nfs_resop4, nfs4.nfs_resop4(nfs4.nfs_opnum4(op), res))
            decoded, end = nfs4.dec_nfs_resop4(Reader(encoded), 0)
            assert end == len(encoded)
            results.append(decoded.value)
            status = nfs4.OPERATIONS[op].status_of(res)
            if status != OK:
                break
        return Reply(status, results, ctx)


# Operation constructors.
def PUTROOTFH() -> tuple[int, Any]:
    return nfs4.OP_PUTROOTFH, None


def PUTPUBFH() -> tuple[int, Any]:
    return nfs4.OP_PUTPUBFH, None


def PUTFH(fh: bytes) -> tuple[int, Any]:
    return nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)


def GETFH() -> tuple[int, Any]:
    return nfs4.OP_GETFH, None


def SAVEFH() -> tuple[int, Any]:
    return nfs4.OP_SAVEFH, None


def RESTOREFH() -> tuple[int, Any]:
    return nfs4.OP_RESTOREFH, None


def LOOKUP(name: bytes | str) -> tuple[int, Any]:
    return nfs4.OP_LOOKUP, nfs4.LOOKUP4args(os.fsencode(name))


def LOOKUPP() -> tuple[int, Any]:
    return nfs4.OP_LOOKUPP, None


def SECINFO(name: bytes | str) -> tuple[int, Any]:
    return nfs4.OP_SECINFO, nfs4.SECINFO4args(os.fsencode(name))


def SECINFO_NO_NAME(style: int) -> tuple[int, Any]:
    return nfs4.OP_SECINFO_NO_NAME, nfs4.secinfo_style4(style)


def GETATTR(*numbers: int) -> tuple[int, Any]:
    return nfs4.OP_GETATTR, nfs4.GETATTR4args(attrs.bitmap_of(numbers))


def SETATTR(
    pairs: list[tuple[int, bytes]], stateid: nfs4.stateid4 = ANONYMOUS_STATEID
) -> tuple[int, Any]:
    return nfs4.OP_SETATTR, nfs4.SETATTR4args(stateid, fattr(pairs))


def VERIFY(f: nfs4.fattr4) -> tuple[int, Any]:
    return nfs4.OP_VERIFY, nfs4.VERIFY4args(f)


def NVERIFY(f: nfs4.fattr4) -> tuple[int, Any]:
    return nfs4.OP_NVERIFY, nfs4.NVERIFY4args(f)


def ACCESS(mask: int) -> tuple[int, Any]:
    return nfs4.OP_ACCESS, nfs4.ACCESS4args(mask)


def READDIR(
    cookie: int = 0,
    verf: bytes = bytes(8),
    dircount: int = 0,
    maxcount: int = 65536,
    numbers: tuple[int, ...] = (nfs4.FATTR4_TYPE, nfs4.FATTR4_FILEID),
) -> tuple[int, Any]:
    return nfs4.OP_READDIR, nfs4.READDIR4args(
        cookie, verf, dircount, maxcount, attrs.bitmap_of(numbers)
    )


def CREATE(
    ftype: int,
    name: bytes | str,
    data: Any = None,
    pairs: list[tuple[int, bytes]] | None = None,
) -> tuple[int, Any]:
    return nfs4.OP_CREATE, nfs4.CREATE4args(
        nfs4.createtype4(nfs4.nfs_ftype4(ftype), data), os.fsencode(name), fattr(pairs or [])
    )


def REMOVE(name: bytes | str) -> tuple[int, Any]:
    return nfs4.OP_REMOVE, nfs4.REMOVE4args(os.fsencode(name))


def RENAME(old: bytes | str, new: bytes | str) -> tuple[int, Any]:
    return nfs4.OP_RENAME, nfs4.RENAME4args(os.fsencode(old), os.fsencode(new))


def LINK(name: bytes | str) -> tuple[int, Any]:
    return nfs4.OP_LINK, nfs4.LINK4args(os.fsencode(name))


def READLINK() -> tuple[int, Any]:
    return nfs4.OP_READLINK, None


def fattr(pairs: list[tuple[int, bytes]]) -> nfs4.fattr4:
    pairs = sorted(pairs)
    return nfs4.fattr4(attrs.bitmap_of(n for n, _ in pairs), b"".join(v for _, v in pairs))


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def utf8(s: str) -> bytes:
    w = Writer()
    nfs4.enc_utf8str_mixed(w, s.encode())
    return bytes(w)


def decode_attrs(f: nfs4.fattr4) -> dict[int, Any]:
    names = {
        getattr(nfs4, n): n.removeprefix("FATTR4_").lower()
        for n in dir(nfs4)
        if n.startswith("FATTR4_")
    }
    r = Reader(f.attr_vals)
    off = 0
    out: dict[int, Any] = {}
    for n in attrs.attr_numbers(f.attrmask):
        out[n], off = getattr(nfs4, f"dec_fattr4_{names[n]}")(r, off)
    assert off == len(f.attr_vals)
    return out


MODE = nfs4.FATTR4_MODE
SIZE = nfs4.FATTR4_SIZE


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def export_dir(tmp_path: Path) -> Path:
    d = tmp_path / "export"
    d.mkdir()
    d.chmod(0o755)
    return d


@pytest.fixture
def vfs(export_dir: Path, tmp_path: Path) -> Iterator[LocalVfs]:
    v = LocalVfs(Export(str(export_dir), root_squash=False, state_dir=str(tmp_path / "state")))
    yield v
    v.release_identity()
    v.close()


@pytest.fixture
def server(vfs: LocalVfs) -> Server:
    return Server(vfs)


def fh_of(server: Server, *path: str) -> bytes:
    ops = [PUTROOTFH(), *(LOOKUP(p) for p in path), GETFH()]
    reply = server.run(*ops)
    assert reply.status == OK, reply.status
    return bytes(reply.last.value.object)


# ---------------------------------------------------------------- filehandles


def test_putrootfh_getfh(server: Server, vfs: LocalVfs) -> None:
    reply = server.run(PUTROOTFH(), GETFH(), PUTPUBFH(), GETFH())
    assert reply.status == OK
    assert reply[1].value.object == vfs.root_handle() == reply[3].value.object


@pytest.mark.parametrize(
    "op",
    [
        GETFH(),
        SAVEFH(),
        LOOKUP("x"),
        LOOKUPP(),
        GETATTR(nfs4.FATTR4_SIZE),
        SETATTR([(MODE, u32(0o644))]),
        VERIFY(fattr([])),
        NVERIFY(fattr([])),
        ACCESS(1),
        READDIR(),
        CREATE(nfs4.NF4DIR, "d"),
        REMOVE("x"),
        RENAME("a", "b"),
        LINK("l"),
        READLINK(),
        SECINFO("x"),
        SECINFO_NO_NAME(nfs4.SECINFO_STYLE4_CURRENT_FH),
    ],
)
def test_no_current_filehandle(server: Server, op: tuple[int, Any]) -> None:
    assert server.run(op).status == nfs4.NFS4ERR_NOFILEHANDLE


def test_rename_and_link_need_a_saved_filehandle(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    assert server.run(PUTROOTFH(), RENAME("f", "g")).status == nfs4.NFS4ERR_NOFILEHANDLE
    assert server.run(PUTROOTFH(), LINK("g")).status == nfs4.NFS4ERR_NOFILEHANDLE


def test_restorefh_without_saved(server: Server) -> None:
    assert server.run(PUTROOTFH(), RESTOREFH()).status == nfs4.NFS4ERR_RESTOREFH


def test_savefh_restorefh_carry_the_stateid(server: Server, export_dir: Path) -> None:
    """RFC 8881 section 16.2.3.1.2: the saved stateid travels with the saved filehandle."""
    (export_dir / "f").write_bytes(b"")
    ctx = server.context()
    assert server.run_in(ctx, PUTROOTFH(), LOOKUP("f")).status == OK
    sid = nfs4.stateid4(3, b"x" * 12)
    ctx.current_stateid = sid
    file_fh = ctx.current_fh
    assert server.run_in(ctx, SAVEFH(), PUTROOTFH()).status == OK
    assert ctx.current_stateid is None  # a new current filehandle drops the current stateid
    assert server.run_in(ctx, RESTOREFH()).status == OK
    assert ctx.current_fh == file_fh and ctx.current_stateid == sid


def test_putfh_bad_handles(server: Server, vfs: LocalVfs, export_dir: Path, tmp_path: Path) -> None:
    root = vfs.root_handle()
    assert server.run(PUTFH(root)).status == OK
    assert server.run(PUTFH(b"")).status == nfs4.NFS4ERR_BADHANDLE
    assert server.run(PUTFH(root[:-1])).status == nfs4.NFS4ERR_BADHANDLE  # truncated
    forged = bytes([root[0]]) + bytes(b ^ 0x5A for b in root[1:])
    assert server.run(PUTFH(forged)).status == nfs4.NFS4ERR_BADHANDLE
    assert server.run(PUTFH(os.urandom(64))).status == nfs4.NFS4ERR_BADHANDLE
    # A handle from another export (another secret) is foreign.
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = LocalVfs(Export(str(other_dir), root_squash=False, state_dir=str(tmp_path / "st2")))
    try:
        assert server.run(PUTFH(other.root_handle())).status == nfs4.NFS4ERR_BADHANDLE
    finally:
        other.close()
    # A removed object's handle is stale.
    (export_dir / "gone").write_bytes(b"x")
    fh = fh_of(server, "gone")
    (export_dir / "gone").unlink()
    assert server.run(PUTFH(fh)).status == nfs4.NFS4ERR_STALE


# ---------------------------------------------------------------- LOOKUP, LOOKUPP, SECINFO


@pytest.mark.parametrize(
    ("name", "status"),
    [
        (b"", nfs4.NFS4ERR_INVAL),
        (b".", nfs4.NFS4ERR_BADNAME),
        (b"..", nfs4.NFS4ERR_BADNAME),
        (b"a/b", nfs4.NFS4ERR_BADNAME),
        (b"a\0b", nfs4.NFS4ERR_BADNAME),
        (b"x" * 256, nfs4.NFS4ERR_NAMETOOLONG),
        (b"\xff\xfe", nfs4.NFS4ERR_INVAL),  # not UTF-8 (RFC 8881 section 14)
        (b"missing", nfs4.NFS4ERR_NOENT),
    ],
)
def test_lookup_bad_names(server: Server, name: bytes, status: int) -> None:
    assert server.run(PUTROOTFH(), LOOKUP(name)).status == status


@pytest.mark.parametrize(
    "make_op",
    [
        lambda n: CREATE(nfs4.NF4DIR, n),
        lambda n: REMOVE(n),
        lambda n: SECINFO(n),
        lambda n: CREATE(nfs4.NF4LNK, n, b"target"),
    ],
)
def test_bad_names_everywhere(server: Server, make_op: Any) -> None:
    for name, status in (
        (b"", nfs4.NFS4ERR_INVAL),
        (b".", nfs4.NFS4ERR_BADNAME),
        (b"..", nfs4.NFS4ERR_BADNAME),
        (b"a/b", nfs4.NFS4ERR_BADNAME),
        (b"y" * 256, nfs4.NFS4ERR_NAMETOOLONG),
        (b"\xc3\x28", nfs4.NFS4ERR_INVAL),
    ):
        assert server.run(PUTROOTFH(), make_op(name)).status == status, name


def test_lookup_and_lookupp(server: Server, export_dir: Path, vfs: LocalVfs) -> None:
    (export_dir / "d" / "e").mkdir(parents=True)
    (export_dir / "d" / "e" / "f").write_bytes(b"x")
    (export_dir / "héllo").write_bytes(b"")
    reply = server.run(PUTROOTFH(), LOOKUP("d"), LOOKUP("e"), LOOKUP("f"), GETATTR(20))
    assert reply.status == OK
    assert (
        decode_attrs(reply.last.value.obj_attributes)[20]
        == (export_dir / "d" / "e" / "f").stat().st_ino
    )
    reply = server.run(PUTROOTFH(), LOOKUP("d"), LOOKUP("e"), LOOKUPP(), LOOKUPP(), GETFH())
    assert reply.status == OK and reply.last.value.object == vfs.root_handle()
    assert server.run(PUTROOTFH(), LOOKUP("héllo")).status == OK
    assert server.run(PUTROOTFH(), LOOKUPP()).status == nfs4.NFS4ERR_NOENT


def test_lookup_in_non_directories(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    os.symlink("f", export_dir / "l")
    assert server.run(PUTROOTFH(), LOOKUP("f"), LOOKUP("x")).status == nfs4.NFS4ERR_NOTDIR
    assert server.run(PUTROOTFH(), LOOKUP("l"), LOOKUP("x")).status == nfs4.NFS4ERR_SYMLINK
    assert server.run(PUTROOTFH(), LOOKUP("f"), LOOKUPP()).status == nfs4.NFS4ERR_NOTDIR


def test_secinfo_consumes_the_filehandle(server: Server, export_dir: Path) -> None:
    (export_dir / "d").mkdir()
    reply = server.run(PUTROOTFH(), SECINFO("d"))
    assert reply.status == OK
    assert [s.flavor for s in reply.last.value] == [rpc.AUTH_SYS, rpc.AUTH_NONE]
    assert server.run(PUTROOTFH(), SECINFO("d"), GETFH()).status == nfs4.NFS4ERR_NOFILEHANDLE
    assert server.run(PUTROOTFH(), SECINFO("nope")).status == nfs4.NFS4ERR_NOENT
    reply = server.run(PUTROOTFH(), SECINFO_NO_NAME(nfs4.SECINFO_STYLE4_CURRENT_FH), GETFH())
    assert reply.status == nfs4.NFS4ERR_NOFILEHANDLE
    assert [s.flavor for s in reply[1].value] == [rpc.AUTH_SYS, rpc.AUTH_NONE]
    parent = SECINFO_NO_NAME(nfs4.SECINFO_STYLE4_PARENT)
    assert server.run(PUTROOTFH(), parent).status == nfs4.NFS4ERR_NOENT  # the root
    assert server.run(PUTROOTFH(), LOOKUP("d"), parent).status == OK


# ---------------------------------------------------------------- GETATTR, SETATTR, VERIFY


def test_getattr_matches_stat(server: Server, export_dir: Path, vfs: LocalVfs) -> None:
    p = export_dir / "f"
    p.write_bytes(b"hello")
    os.chown(p, 1234, 567)
    p.chmod(0o640)
    numbers = sorted(attrs.SUPPORTED - attrs.WRITE_ONLY)
    reply = server.run(PUTROOTFH(), LOOKUP("f"), GETFH(), GETATTR(*numbers))
    assert reply.status == OK
    got = decode_attrs(reply.last.value.obj_attributes)
    st = p.stat()
    sv = os.statvfs(p)
    assert got[nfs4.FATTR4_TYPE] == nfs4.NF4REG
    assert got[nfs4.FATTR4_SIZE] == 5
    assert got[nfs4.FATTR4_MODE] == 0o640
    assert got[nfs4.FATTR4_OWNER] == b"1234" and got[nfs4.FATTR4_OWNER_GROUP] == b"567"
    assert got[nfs4.FATTR4_FILEID] == st.st_ino
    assert got[nfs4.FATTR4_NUMLINKS] == 1
    assert got[nfs4.FATTR4_FILEHANDLE] == reply[2].value.object
    assert got[nfs4.FATTR4_TIME_MODIFY] == nfs4.nfstime4(*divmod(st.st_mtime_ns, 10**9))
    assert got[nfs4.FATTR4_SPACE_TOTAL] == sv.f_blocks * sv.f_frsize
    assert got[nfs4.FATTR4_MAXNAME] == sv.f_namemax
    assert got[nfs4.FATTR4_LEASE_TIME] == server.state.config.lease_time
    assert got[nfs4.FATTR4_FSID] == nfs4.fsid4(os.major(st.st_dev), os.minor(st.st_dev))


def test_getattr_write_only_and_unsupported(server: Server) -> None:
    reply = server.run(PUTROOTFH(), GETATTR(nfs4.FATTR4_TIME_MODIFY_SET))
    assert reply.status == nfs4.NFS4ERR_INVAL
    reply = server.run(PUTROOTFH(), GETATTR(nfs4.FATTR4_ACL, nfs4.FATTR4_TYPE, 90))
    assert reply.status == OK
    f = reply.last.value.obj_attributes
    assert attrs.attr_numbers(f.attrmask) == [nfs4.FATTR4_TYPE]


def test_setattr(server: Server, export_dir: Path) -> None:
    p = export_dir / "f"
    p.write_bytes(b"0123456789")
    pairs = [
        (SIZE, u64(4)),
        (MODE, u32(0o600)),
        (nfs4.FATTR4_OWNER, utf8("4321")),
        (nfs4.FATTR4_OWNER_GROUP, utf8("root")),
        (
            nfs4.FATTR4_TIME_MODIFY_SET,
            pack(
                nfs4.enc_settime4,
                nfs4.settime4(nfs4.SET_TO_CLIENT_TIME4, nfs4.nfstime4(1_000_000, 42)),
            ),
        ),
        (
            nfs4.FATTR4_TIME_ACCESS_SET,
            pack(nfs4.enc_settime4, nfs4.settime4(nfs4.SET_TO_SERVER_TIME4)),
        ),
    ]
    reply = server.run(PUTROOTFH(), LOOKUP("f"), SETATTR(pairs))
    assert reply.status == OK
    assert reply.last.attrsset == fattr(pairs).attrmask
    st = p.stat()
    assert (st.st_size, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (4, 0o600, 4321, 0)
    assert st.st_mtime_ns == 1_000_000 * 10**9 + 42
    assert st.st_atime_ns > 1_000_000 * 10**9 + 42


def test_setattr_errors(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    base = (PUTROOTFH(), LOOKUP("f"))
    for pairs, status in (
        ([(nfs4.FATTR4_TYPE, u32(2))], nfs4.NFS4ERR_INVAL),
        ([(nfs4.FATTR4_ACL, u32(0))], nfs4.NFS4ERR_ATTRNOTSUPP),
        ([(nfs4.FATTR4_OWNER, utf8("no-such-user-xyzzy"))], nfs4.NFS4ERR_BADOWNER),
        ([(MODE, u32(0o170000))], nfs4.NFS4ERR_INVAL),
    ):
        reply = server.run(*base, SETATTR(pairs))
        assert reply.status == status
        assert reply.last.attrsset == []
    truncated = nfs4.SETATTR4args(ANONYMOUS_STATEID, nfs4.fattr4(attrs.bitmap_of([SIZE]), b"\0"))
    assert server.run(*base, (nfs4.OP_SETATTR, truncated)).status == nfs4.NFS4ERR_BADXDR
    # Size of a directory.
    assert server.run(PUTROOTFH(), SETATTR([(SIZE, u64(0))])).status == nfs4.NFS4ERR_ISDIR
    # A stateid the server never issued, for a size change.
    bogus = nfs4.stateid4(1, b"\x01" * 12)
    ctx = server.context()
    ctx.session = cast(Any, type("Session", (), {"clientid": 1})())
    reply = server.run_in(ctx, *base, SETATTR([(SIZE, u64(0))], bogus))
    assert reply.status in (nfs4.NFS4ERR_BAD_STATEID, nfs4.NFS4ERR_STALE_STATEID)


def test_setattr_as_other_user_is_refused(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    reply = server.run(PUTROOTFH(), LOOKUP("f"), SETATTR([(MODE, u32(0o777))]), cred=U1000)
    assert reply.status == nfs4.NFS4ERR_PERM


def test_verify_nverify(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"abc")
    base = (PUTROOTFH(), LOOKUP("f"))
    same = fattr([(SIZE, u64(3)), (nfs4.FATTR4_TYPE, u32(nfs4.NF4REG))])
    other = fattr([(SIZE, u64(4))])
    assert server.run(*base, VERIFY(same)).status == OK
    assert server.run(*base, VERIFY(other)).status == nfs4.NFS4ERR_NOT_SAME
    assert server.run(*base, NVERIFY(same)).status == nfs4.NFS4ERR_SAME
    assert server.run(*base, NVERIFY(other)).status == OK
    truncated = nfs4.fattr4(attrs.bitmap_of([SIZE]), b"\0\0\0\0")
    assert server.run(*base, VERIFY(truncated)).status == nfs4.NFS4ERR_NOT_SAME
    owner = fattr([(nfs4.FATTR4_OWNER, utf8("0"))])
    assert server.run(*base, VERIFY(owner)).status == OK
    for bad, status in (
        (fattr([(nfs4.FATTR4_ACL, b"")]), nfs4.NFS4ERR_ATTRNOTSUPP),
        (fattr([(nfs4.FATTR4_RDATTR_ERROR, u32(0))]), nfs4.NFS4ERR_INVAL),
        (fattr([(nfs4.FATTR4_TIME_ACCESS_SET, u32(0))]), nfs4.NFS4ERR_INVAL),
    ):
        assert server.run(*base, VERIFY(bad)).status == status
        assert server.run(*base, NVERIFY(bad)).status == status


def test_access(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    (export_dir / "f").chmod(0o644)
    (export_dir / "x").write_bytes(b"")
    (export_dir / "x").chmod(0o755)
    reply = server.run(PUTROOTFH(), LOOKUP("f"), ACCESS(0x3F))
    assert reply.status == OK
    file_bits = nfs4.ACCESS4_READ | nfs4.ACCESS4_MODIFY | nfs4.ACCESS4_EXTEND | nfs4.ACCESS4_EXECUTE
    assert reply.last.value.supported == file_bits
    assert reply.last.value.access == file_bits & ~nfs4.ACCESS4_EXECUTE  # root, not executable
    reply = server.run(PUTROOTFH(), LOOKUP("f"), ACCESS(0x3F), cred=U1000)
    assert reply.last.value.access == nfs4.ACCESS4_READ
    reply = server.run(PUTROOTFH(), LOOKUP("x"), ACCESS(nfs4.ACCESS4_EXECUTE), cred=U1000)
    assert reply.last.value.access == nfs4.ACCESS4_EXECUTE
    reply = server.run(PUTROOTFH(), ACCESS(0x3F), cred=U1000)
    dir_bits = 0x3F & ~nfs4.ACCESS4_EXECUTE
    assert reply.last.value.supported == dir_bits
    assert reply.last.value.access == nfs4.ACCESS4_READ | nfs4.ACCESS4_LOOKUP
    assert server.run(PUTROOTFH(), ACCESS(0x40)).status == nfs4.NFS4ERR_INVAL


# ---------------------------------------------------------------- CREATE, REMOVE, RENAME, LINK


def test_create_directory(server: Server, export_dir: Path) -> None:
    reply = server.run(
        PUTROOTFH(),
        GETATTR(nfs4.FATTR4_CHANGE),
        CREATE(nfs4.NF4DIR, "d", pairs=[(MODE, u32(0o750))]),
        GETFH(),
        GETATTR(nfs4.FATTR4_TYPE, nfs4.FATTR4_MODE),
    )
    assert reply.status == OK
    before = decode_attrs(reply[1].value.obj_attributes)[nfs4.FATTR4_CHANGE]
    resok = reply[2].value
    assert resok.cinfo.before == before and resok.cinfo.after != before
    assert resok.attrset == attrs.bitmap_of([MODE])
    assert decode_attrs(reply.last.value.obj_attributes) == {
        nfs4.FATTR4_TYPE: nfs4.NF4DIR,
        MODE: 0o750,
    }
    assert stat.S_IMODE((export_dir / "d").stat().st_mode) == 0o750
    assert reply[3].value.object == fh_of(server, "d")  # the current fh is the new object
    assert server.run(PUTROOTFH(), CREATE(nfs4.NF4DIR, "d")).status == nfs4.NFS4ERR_EXIST


def test_create_symlink_and_readlink(server: Server, export_dir: Path) -> None:
    target = "../some/where/é"
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4LNK, "l", target.encode()), READLINK())
    assert reply.status == OK
    assert bytes(reply.last.value.link) == target.encode()
    assert os.readlink(export_dir / "l") == target
    for data in (b"", b"a\0b", b"\xff"):
        reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4LNK, "bad", data))
        assert reply.status == nfs4.NFS4ERR_INVAL
    assert not (export_dir / "bad").exists()


def test_create_special_files(server: Server, export_dir: Path) -> None:
    for ftype, name, test in (
        (nfs4.NF4FIFO, "fifo", stat.S_ISFIFO),
        (nfs4.NF4SOCK, "sock", stat.S_ISSOCK),
    ):
        reply = server.run(PUTROOTFH(), CREATE(ftype, name, pairs=[(MODE, u32(0o640))]), GETATTR(1))
        assert reply.status == OK
        st = os.lstat(export_dir / name)
        assert test(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    dev = nfs4.specdata4(1, 3)  # like /dev/null
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4CHR, "null", dev), GETATTR(41))
    assert reply.status == OK
    assert decode_attrs(reply.last.value.obj_attributes)[41] == dev
    st = os.lstat(export_dir / "null")
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4BLK, "blk", nfs4.specdata4(7, 0)))
    assert reply.status == OK and stat.S_ISBLK(os.lstat(export_dir / "blk").st_mode)


def test_create_bad_types_and_attributes(server: Server, export_dir: Path) -> None:
    assert server.run(PUTROOTFH(), CREATE(nfs4.NF4REG, "f")).status == nfs4.NFS4ERR_BADTYPE
    assert server.run(PUTROOTFH(), CREATE(nfs4.NF4NAMEDATTR, "f")).status == nfs4.NFS4ERR_BADTYPE
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4DIR, "d", pairs=[(nfs4.FATTR4_ACL, b"")]))
    assert reply.status == nfs4.NFS4ERR_ATTRNOTSUPP
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4DIR, "d", pairs=[(20, u64(1))]))
    assert reply.status == nfs4.NFS4ERR_INVAL  # fileid is read-only
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4DIR, "d", pairs=[(SIZE, u64(0))]))
    assert reply.status == nfs4.NFS4ERR_INVAL
    assert not (export_dir / "d").exists()
    (export_dir / "f").write_bytes(b"")
    reply = server.run(PUTROOTFH(), LOOKUP("f"), CREATE(nfs4.NF4DIR, "d"))
    assert reply.status == nfs4.NFS4ERR_NOTDIR


def test_create_with_owner(server: Server, export_dir: Path) -> None:
    mtime = nfs4.settime4(nfs4.SET_TO_CLIENT_TIME4, nfs4.nfstime4(86400, 5))
    pairs = [
        (MODE, u32(0o2775)),
        (nfs4.FATTR4_OWNER_GROUP, utf8("1500")),
        (nfs4.FATTR4_TIME_MODIFY_SET, pack(nfs4.enc_settime4, mtime)),
    ]
    reply = server.run(PUTROOTFH(), CREATE(nfs4.NF4DIR, "g", pairs=pairs))
    assert reply.status == OK
    assert reply.last.value.attrset == fattr(pairs).attrmask
    st = (export_dir / "g").stat()
    assert st.st_gid == 1500 and stat.S_IMODE(st.st_mode) == 0o2775  # set-gid kept
    assert st.st_mtime_ns == 86400 * 10**9 + 5


def test_remove(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    (export_dir / "d").mkdir()
    (export_dir / "full").mkdir()
    (export_dir / "full" / "x").write_bytes(b"")
    reply = server.run(PUTROOTFH(), REMOVE("f"), REMOVE("d"))
    assert reply.status == OK
    assert reply[1].value.cinfo.before != reply[1].value.cinfo.after
    assert reply[2].value.cinfo.before == reply[1].value.cinfo.after
    assert not (export_dir / "f").exists() and not (export_dir / "d").exists()
    assert server.run(PUTROOTFH(), REMOVE("full")).status == nfs4.NFS4ERR_NOTEMPTY
    assert server.run(PUTROOTFH(), REMOVE("f")).status == nfs4.NFS4ERR_NOENT
    reply = server.run(PUTROOTFH(), LOOKUP("full"), LOOKUP("x"), REMOVE("y"))
    assert reply.status == nfs4.NFS4ERR_NOTDIR


def test_remove_as_other_user(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    assert server.run(PUTROOTFH(), REMOVE("f"), cred=U1000).status == nfs4.NFS4ERR_ACCESS


def test_rename(server: Server, export_dir: Path) -> None:
    (export_dir / "a").mkdir()
    (export_dir / "b").mkdir()
    (export_dir / "a" / "f").write_bytes(b"data")
    (export_dir / "b" / "old").write_bytes(b"old")
    reply = server.run(
        PUTROOTFH(),
        LOOKUP("a"),
        SAVEFH(),
        PUTROOTFH(),
        LOOKUP("b"),
        RENAME("f", "old"),  # replaces b/old
    )
    assert reply.status == OK
    res = reply.last.value
    assert res.source_cinfo.before != res.source_cinfo.after
    assert res.target_cinfo.before != res.target_cinfo.after
    assert (export_dir / "b" / "old").read_bytes() == b"data"
    assert not (export_dir / "a" / "f").exists()
    # Within one directory both change_info4 agree.
    reply = server.run(PUTROOTFH(), LOOKUP("b"), SAVEFH(), RENAME("old", "new"))
    assert reply.status == OK
    assert reply.last.value.source_cinfo == reply.last.value.target_cinfo
    assert (export_dir / "b" / "new").exists()
    # Errors.
    base = (PUTROOTFH(), LOOKUP("b"), SAVEFH())
    assert server.run(*base, RENAME("nope", "x")).status == nfs4.NFS4ERR_NOENT
    assert server.run(*base, RENAME("new", "..")).status == nfs4.NFS4ERR_BADNAME
    assert server.run(*base, RENAME("", "x")).status == nfs4.NFS4ERR_INVAL
    assert server.run(*base, RENAME("new", "z" * 256)).status == nfs4.NFS4ERR_NAMETOOLONG
    (export_dir / "a" / "sub").mkdir()
    reply = server.run(PUTROOTFH(), SAVEFH(), LOOKUP("a"), RENAME("a", "inside"))
    assert reply.status == nfs4.NFS4ERR_INVAL  # a directory into itself
    (export_dir / "b" / "dir").mkdir()
    (export_dir / "b" / "dir" / "x").write_bytes(b"")
    (export_dir / "b" / "empty").mkdir()
    # Incompatible or non-empty targets: NFS4ERR_EXIST (RFC 8881 section 18.26.3).
    assert server.run(*base, RENAME("empty", "dir")).status == nfs4.NFS4ERR_EXIST
    assert server.run(*base, RENAME("new", "empty")).status == nfs4.NFS4ERR_EXIST
    assert server.run(*base, RENAME("empty", "new")).status == nfs4.NFS4ERR_EXIST
    reply = server.run(*base, RENAME("empty", "new2"), LOOKUP("new2"))
    assert reply.status == OK
    reply = server.run(PUTROOTFH(), LOOKUP("b"), LOOKUP("new"), SAVEFH(), RENAME("a", "b"))
    assert reply.status == nfs4.NFS4ERR_NOTDIR


def test_link(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"x")
    (export_dir / "d").mkdir()
    reply = server.run(
        PUTROOTFH(), LOOKUP("f"), SAVEFH(), PUTROOTFH(), LOOKUP("d"), LINK("g"), GETFH()
    )
    assert reply.status == OK
    assert reply[5].value.cinfo.before != reply[5].value.cinfo.after
    assert reply.last.value.object == fh_of(server, "d")  # the directory stays current
    assert (export_dir / "f").stat().st_nlink == 2
    assert (export_dir / "d" / "g").samefile(export_dir / "f")
    reply = server.run(PUTROOTFH(), LOOKUP("f"), SAVEFH(), PUTROOTFH(), LOOKUP("d"), LINK("g"))
    assert reply.status == nfs4.NFS4ERR_EXIST
    reply = server.run(PUTROOTFH(), LOOKUP("d"), SAVEFH(), PUTROOTFH(), LINK("d2"))
    assert reply.status == nfs4.NFS4ERR_ISDIR
    reply = server.run(PUTROOTFH(), LOOKUP("f"), SAVEFH(), LINK("h"))
    assert reply.status == nfs4.NFS4ERR_NOTDIR
    reply = server.run(PUTROOTFH(), LOOKUP("f"), SAVEFH(), PUTROOTFH(), LINK("."))
    assert reply.status == nfs4.NFS4ERR_BADNAME


def test_readlink_on_other_types(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    assert server.run(PUTROOTFH(), LOOKUP("f"), READLINK()).status == nfs4.NFS4ERR_INVAL
    assert server.run(PUTROOTFH(), READLINK()).status == nfs4.NFS4ERR_INVAL


def test_read_only_export(export_dir: Path, tmp_path: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    vfs = LocalVfs(Export(str(export_dir), read_only=True, state_dir=str(tmp_path / "ro")))
    try:
        server = Server(vfs)
        for op in (
            CREATE(nfs4.NF4DIR, "d"),
            REMOVE("f"),
            SETATTR([(MODE, u32(0o600))]),
        ):
            assert server.run(PUTROOTFH(), op).status == nfs4.NFS4ERR_ROFS
        reply = server.run(PUTROOTFH(), ACCESS(0x3F))
        assert reply.last.value.access & nfs4.ACCESS4_MODIFY == 0
    finally:
        vfs.release_identity()
        vfs.close()


# ---------------------------------------------------------------- READDIR


def read_all(
    server: Server, maxcount: int, dircount: int = 0, numbers: tuple[int, ...] = (1, 20)
) -> tuple[list[nfs4.entry4], int]:
    """Page through the root directory; returns the entries and the number of READDIRs."""
    cookie, verf = 0, bytes(8)
    entries: list[nfs4.entry4] = []
    calls = 0
    while True:
        reply = server.run(PUTROOTFH(), READDIR(cookie, verf, dircount, maxcount, numbers))
        assert reply.status == OK, reply.status
        calls += 1
        resok = reply.last.value
        size = len(pack(nfs4.enc_READDIR4resok, resok))
        assert size <= maxcount  # maxcount bounds the whole READDIR4resok
        entries.extend(resok.reply.entries)
        if resok.reply.eof:
            return entries, calls
        assert resok.reply.entries, "no progress without eof"
        cookie, verf = resok.reply.entries[-1].cookie, resok.cookieverf


def test_readdir_lists_everything_once(server: Server, export_dir: Path) -> None:
    names = {f"file-{i:04d}-{'x' * (i % 37)}" for i in range(300)}
    for n in names:
        (export_dir / n).write_bytes(b"")
    (export_dir / "sub").mkdir()
    names.add("sub")
    entries, calls = read_all(server, 65536)
    assert calls == 1
    assert sorted(e.name.decode() for e in entries) == sorted(names)
    for e in entries:
        got = decode_attrs(e.attrs)
        st = os.lstat(export_dir / e.name.decode())
        assert got[nfs4.FATTR4_FILEID] == st.st_ino
        assert got[nfs4.FATTR4_TYPE] == (nfs4.NF4DIR if e.name == b"sub" else nfs4.NF4REG)
    assert len({e.cookie for e in entries}) == len(entries)
    assert all(e.cookie > 2 for e in entries)
    paged, calls = read_all(server, 1500)
    assert calls > 5
    assert [e.name for e in paged] == [e.name for e in entries]


def test_readdir_of_a_large_directory_goes_on_in_the_thread_pool(
    vfs: LocalVfs, export_dir: Path
) -> None:
    """The first readdir_inline entries are listed on the caller's thread (the event loop);
    when the reply has room for more of a directory that has more, the rest is listed in the
    thread pool, and the reply is the same as one listed at once (paging included)."""
    for i in range(150):
        (export_dir / f"f{i:03d}-{'y' * (i % 23)}").write_bytes(b"")
    threads: list[str] = []
    real = vfs.readdir

    def spy(*a: Any, **kw: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*a, **kw)

    vfs.readdir = spy  # type: ignore[method-assign]
    inline = Server(vfs, ServerConfig(readdir_inline=10_000))
    pooled = Server(vfs, ServerConfig(readdir_inline=16))
    for maxcount, dircount in ((1 << 20, 0), (65536, 0), (3000, 0), (65536, 16 * 40), (900, 1)):
        cookie, verf = 0, bytes(8)
        while True:
            ops = (PUTROOTFH(), READDIR(cookie, verf, dircount, maxcount))
            want, got = inline.run(*ops), pooled.run(*ops)
            assert want.status == got.status == OK
            a, b = want.last.value, got.last.value
            assert pack(nfs4.enc_READDIR4resok, a) == pack(nfs4.enc_READDIR4resok, b)
            if a.reply.eof:
                break
            cookie, verf = a.reply.entries[-1].cookie, a.cookieverf
    assert inline.awaited == 0
    assert pooled.awaited > 0
    me = threading.current_thread().name
    assert me in threads and any(t.startswith("nfsrdma-io") for t in threads), threads
    # A directory within readdir_inline entries never leaves the caller's thread.
    sub = export_dir / "small"
    sub.mkdir()
    for i in range(16):
        (sub / str(i)).write_bytes(b"")
    threads.clear()
    reply = pooled.run(PUTROOTFH(), LOOKUP("small"), READDIR(maxcount=1 << 20))
    assert reply.status == OK and len(reply.last.value.reply.entries) == 16
    assert threads == [me]


def test_readdir_fails_cleanly_in_the_thread_pool(vfs: LocalVfs, export_dir: Path) -> None:
    """An error of the part listed in the pool is the READDIR's status, as on the loop."""
    for i in range(40):
        (export_dir / f"e{i:02d}").write_bytes(b"")
    real = vfs.readdir
    calls: list[int] = []

    def failing(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.EIO, "the disk went away")
        return real(*a, **kw)

    vfs.readdir = failing  # type: ignore[method-assign]
    server = Server(vfs, ServerConfig(readdir_inline=8))
    assert server.run(PUTROOTFH(), READDIR()).status == nfs4.NFS4ERR_IO
    assert server.awaited == 1 and len(calls) == 2
    vfs.readdir = real  # type: ignore[method-assign]
    reply = server.run(PUTROOTFH(), READDIR())
    assert reply.status == OK and len(reply.last.value.reply.entries) == 40


def test_readdir_dircount(server: Server, export_dir: Path) -> None:
    for i in range(50):
        (export_dir / f"n{i:02d}").write_bytes(b"")
    # Each entry costs 8 (cookie) + 4 + 4 (name "nXX") = 16 octets of dircount.
    reply = server.run(PUTROOTFH(), READDIR(dircount=16 * 5))
    assert len(reply.last.value.reply.entries) == 5
    assert not reply.last.value.reply.eof
    reply = server.run(PUTROOTFH(), READDIR(dircount=1))  # always at least one entry
    assert len(reply.last.value.reply.entries) == 1
    entries, calls = read_all(server, 65536, dircount=16 * 7)
    assert len(entries) == 50 and calls == 8


def test_readdir_too_small(server: Server, export_dir: Path) -> None:
    assert server.run(PUTROOTFH(), READDIR(maxcount=15)).status == nfs4.NFS4ERR_TOOSMALL
    reply = server.run(PUTROOTFH(), READDIR(maxcount=16))
    assert reply.status == OK and reply.last.value.reply.eof  # empty: fits in 16 octets
    (export_dir / "some-file-name").write_bytes(b"")
    assert server.run(PUTROOTFH(), READDIR(maxcount=40)).status == nfs4.NFS4ERR_TOOSMALL
    # Exactly enough for one entry: 16 + 4 (follows) + 8 (cookie) + 4 + 16 (name) + 8 (mask)
    # + 4 + 12 (type, fileid).
    reply = server.run(PUTROOTFH(), READDIR(maxcount=72))
    assert reply.status == OK and len(reply.last.value.reply.entries) == 1
    assert len(pack(nfs4.enc_READDIR4resok, reply.last.value)) == 72
    assert server.run(PUTROOTFH(), READDIR(maxcount=71)).status == nfs4.NFS4ERR_TOOSMALL


def test_readdir_bad_arguments(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    assert server.run(PUTROOTFH(), READDIR(cookie=1)).status == nfs4.NFS4ERR_BAD_COOKIE
    assert server.run(PUTROOTFH(), READDIR(cookie=2)).status == nfs4.NFS4ERR_BAD_COOKIE
    reply = server.run(PUTROOTFH(), READDIR())
    cookie = reply.last.value.reply.entries[0].cookie
    assert server.run(PUTROOTFH(), READDIR(cookie, b"wrongvrf")).status == nfs4.NFS4ERR_NOT_SAME
    assert server.run(PUTROOTFH(), LOOKUP("f"), READDIR()).status == nfs4.NFS4ERR_NOTDIR
    reply = server.run(PUTROOTFH(), READDIR(numbers=(nfs4.FATTR4_TIME_ACCESS_SET,)))
    assert reply.status == nfs4.NFS4ERR_INVAL


def test_readdir_all_attributes(server: Server, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"12345")
    numbers = tuple(sorted(attrs.SUPPORTED - attrs.WRITE_ONLY))
    reply = server.run(PUTROOTFH(), READDIR(numbers=numbers))
    (entry,) = reply.last.value.reply.entries
    got = decode_attrs(entry.attrs)
    assert got[nfs4.FATTR4_SIZE] == 5
    assert got[nfs4.FATTR4_FILEHANDLE] == fh_of(server, "f")
    assert got[nfs4.FATTR4_RDATTR_ERROR] == OK
    assert got[nfs4.FATTR4_SPACE_TOTAL] > 0


def test_readdir_rdattr_error(server: Server, export_dir: Path) -> None:
    """Entries the caller cannot look up: rdattr_error when asked, else READDIR fails."""
    d = export_dir / "d"
    d.mkdir()
    (d / "f").write_bytes(b"")
    d.chmod(0o744)  # readable, not searchable, by others
    ops = (PUTROOTFH(), LOOKUP("d"))
    reply = server.run(
        *ops, READDIR(numbers=(nfs4.FATTR4_RDATTR_ERROR, nfs4.FATTR4_TYPE)), cred=U1000
    )
    assert reply.status == OK
    (entry,) = reply.last.value.reply.entries
    assert entry.name == b"f"
    assert decode_attrs(entry.attrs) == {nfs4.FATTR4_RDATTR_ERROR: nfs4.NFS4ERR_ACCESS}
    reply = server.run(*ops, READDIR(numbers=(nfs4.FATTR4_TYPE,)), cred=U1000)
    assert reply.status == nfs4.NFS4ERR_ACCESS


def test_readdir_clamped_to_session_reply_size(server: Server, export_dir: Path) -> None:
    """SS-21: a READDIR whose maxcount exceeds ca_maxresponsesize gets a clamped reply."""
    for i in range(200):
        (export_dir / f"entry-{i:03d}").write_bytes(b"")
    ctx = server.context()
    fore = type("Fore", (), {"ca_maxresponsesize": 4096})()
    ctx.session = cast(Any, type("Session", (), {"fore": fore})())
    reply = server.run_in(ctx, PUTROOTFH(), READDIR(maxcount=1 << 20))
    assert reply.status == OK
    resok = reply.last.value
    assert not resok.reply.eof
    assert len(pack(nfs4.enc_READDIR4resok, resok)) <= 4096 - 1024


# ---------------------------------------------------------------- end to end, over TCP

# The attributes the Linux client asks for in READDIR (readdirplus) and after most operations.
LINUX_ATTRS = tuple(getattr(nfs4, f"FATTR4_{n.upper()}") for n in MASKS["linux_readdir_plus"])


def argop(num: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


class Client:
    def __init__(self, session: ClientSession) -> None:
        self.s = session

    async def run(self, *ops: tuple[int, Any]) -> nfs4.COMPOUND4res:
        return await self.s.compound([argop(n, a) for n, a in ops])

    async def ok(self, *ops: tuple[int, Any]) -> list[Any]:
        res = await self.run(*ops)
        assert res.status == OK, [(r.resop.name, r.value) for r in res.resarray]
        return [r.value for r in res.resarray]


@asynccontextmanager
async def tcp_served(tmp_path: Path, rsize: int = 1 << 20) -> AsyncIterator[tuple[Path, Client]]:
    export = tmp_path / "export"
    export.mkdir(exist_ok=True)
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
    )
    await server.start()
    port = server.tcp_port
    session = ClientSession(
        lambda: connect_tcp("127.0.0.1", port),
        SessionOptions(backchannel=False, rsize=rsize, owner=b"namespace-test"),
    )
    try:
        await session.start()
        yield export, Client(session)
    finally:
        await session.close()
        await server.close()


async def listing(c: Client, fh: bytes, maxcount: int = 8192) -> list[nfs4.entry4]:
    """A whole directory through READDIR pages, with the Linux readdirplus attributes."""
    cookie, verf = 0, bytes(8)
    out: list[nfs4.entry4] = []
    while True:
        _, rd = await c.ok(
            PUTFH(fh), READDIR(cookie, verf, maxcount // 2, maxcount, numbers=LINUX_ATTRS)
        )
        out.extend(rd.value.reply.entries)
        if rd.value.reply.eof:
            return out
        cookie, verf = rd.value.reply.entries[-1].cookie, rd.value.cookieverf


async def test_workload_lists_like_the_local_tree(tmp_path: Path) -> None:
    """Build a tree with every CREATE type, links, renames and removals over the wire, then
    walk it with READDIR and compare with lstat, as the test bed compares ``ls -lR``."""
    async with tcp_served(tmp_path) as (export, c):
        root = (await c.ok(PUTROOTFH(), GETFH()))[1].value.object
        mode = [(MODE, u32(0o755))]
        for d in ("a", "b"):
            await c.ok(PUTFH(root), CREATE(nfs4.NF4DIR, d, pairs=mode))
        a = (await c.ok(PUTFH(root), LOOKUP("a"), GETFH()))[2].value.object
        b = (await c.ok(PUTFH(root), LOOKUP("b"), GETFH()))[2].value.object
        for i in range(120):
            await c.ok(PUTFH(a), CREATE(nfs4.NF4DIR, f"dir{i:03d}", pairs=mode))
        await c.ok(PUTFH(a), CREATE(nfs4.NF4LNK, "link", b"dir000/../dir001"))
        await c.ok(PUTFH(a), CREATE(nfs4.NF4FIFO, "fifo", pairs=[(MODE, u32(0o600))]))
        await c.ok(PUTFH(a), CREATE(nfs4.NF4SOCK, "sock", pairs=[(MODE, u32(0o600))]))
        await c.ok(PUTFH(a), CREATE(nfs4.NF4CHR, "null", nfs4.specdata4(1, 3)))
        for i in range(0, 120, 3):  # move a third to b under new names
            await c.ok(PUTFH(a), SAVEFH(), PUTFH(b), RENAME(f"dir{i:03d}", f"moved{i}"))
        for i in range(1, 120, 3):  # remove another third
            await c.ok(PUTFH(a), REMOVE(f"dir{i:03d}"))
        await c.ok(PUTFH(a), LOOKUP("link"), SAVEFH(), PUTFH(b), LINK("hardlink"))
        await c.ok(PUTFH(a), LOOKUP("link"), READLINK())

        for fh, path in ((root, export), (a, export / "a"), (b, export / "b")):
            entries = await listing(c, fh)
            names = sorted(e.name.decode() for e in entries)
            assert names == sorted(os.listdir(path))
            for e in entries:
                got = decode_attrs(e.attrs)
                st = os.lstat(path / e.name.decode())
                assert got[nfs4.FATTR4_FILEID] == st.st_ino
                assert got[MODE] == stat.S_IMODE(st.st_mode)
                assert got[nfs4.FATTR4_NUMLINKS] == st.st_nlink
                assert got[nfs4.FATTR4_SIZE] == st.st_size
                assert got[nfs4.FATTR4_OWNER] == str(st.st_uid).encode()
                assert got[nfs4.FATTR4_TIME_MODIFY] == nfs4.nfstime4(*divmod(st.st_mtime_ns, 10**9))
                assert got[nfs4.FATTR4_RDATTR_ERROR] == OK
                fh_attr = got[nfs4.FATTR4_FILEHANDLE]
                (_, gf) = await c.ok(PUTFH(fh_attr), GETFH())
                assert gf.value.object == fh_attr
        assert os.readlink(export / "b" / "hardlink") == "dir000/../dir001"
        assert stat.S_ISCHR(os.lstat(export / "a" / "null").st_mode)


async def test_getattr_and_setattr_over_the_wire(tmp_path: Path) -> None:
    async with tcp_served(tmp_path) as (export, c):
        (export / "f").write_bytes(b"0123456789")
        res = await c.ok(
            PUTROOTFH(),
            LOOKUP("f"),
            SETATTR([(SIZE, u64(3)), (MODE, u32(0o604))]),
            GETATTR(*sorted(attrs.SUPPORTED - attrs.WRITE_ONLY)),
        )
        got = decode_attrs(res[3].value.obj_attributes)
        assert (got[SIZE], got[MODE]) == (3, 0o604)
        assert (export / "f").read_bytes() == b"012"
        bad = await c.run(PUTROOTFH(), LOOKUP("f"), GETATTR(nfs4.FATTR4_TIME_ACCESS_SET))
        assert bad.status == nfs4.NFS4ERR_INVAL and len(bad.resarray) == 3


async def test_readdir_clamped_by_the_session(tmp_path: Path) -> None:
    """SS-21: maxcount beyond ca_maxresponsesize gets a shorter reply, not REP_TOO_BIG."""
    async with tcp_served(tmp_path, rsize=8192) as (export, c):
        for i in range(400):
            (export / f"a-rather-long-file-name-{i:04d}").write_bytes(b"")
        root = (await c.ok(PUTROOTFH(), GETFH()))[1].value.object
        _, rd = await c.ok(PUTFH(root), READDIR(maxcount=1 << 20, numbers=LINUX_ATTRS))
        assert rd.value.reply.entries and not rd.value.reply.eof
        assert len(await listing(c, root, maxcount=1 << 20)) == 400
