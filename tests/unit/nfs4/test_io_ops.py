"""OPEN/CLOSE/READ/WRITE/COMMIT/LOCK family end to end: our ClientSession talking to a real
NFSServer over TCP on 127.0.0.1, serving a LocalVfs over tmp_path (RFC 8881 sections 8, 9,
18.2, 18.3, 18.10-18.12, 18.16, 18.18, 18.22, 18.32, 18.38, 18.48; SS-30: no OPEN_CONFIRM)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.context import ANONYMOUS_STATEID, BYPASS_STATEID, CURRENT_STATEID
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.tcp import connect_tcp
from nfsrdma.xdr.gen import nfs4

OK = nfs4.NFS4_OK
READ, WRITE, BOTH = (
    nfs4.OPEN4_SHARE_ACCESS_READ,
    nfs4.OPEN4_SHARE_ACCESS_WRITE,
    nfs4.OPEN4_SHARE_ACCESS_BOTH,
)
DENY_NONE, DENY_READ, DENY_WRITE = (
    nfs4.OPEN4_SHARE_DENY_NONE,
    nfs4.OPEN4_SHARE_DENY_READ,
    nfs4.OPEN4_SHARE_DENY_WRITE,
)
MAX = 0xFFFFFFFFFFFFFFFF
LARGE_IO = 4096  # ServerConfig.large_io in these tests: bigger I/O goes to the thread pool


def op(num: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


def name_of(status: int) -> str:
    return nfs4.nfsstat4(status).name


def no_attrs() -> nfs4.fattr4:
    return nfs4.fattr4([], b"")


def mode_attrs(mode: int = 0o644, size: int | None = None) -> nfs4.fattr4:
    vals = b""
    nums = [nfs4.FATTR4_MODE]
    if size is not None:
        nums.insert(0, nfs4.FATTR4_SIZE)
        vals += size.to_bytes(8, "big")
    vals += mode.to_bytes(4, "big")
    return nfs4.fattr4(bitmap_of(nums), vals)


def unchecked(attrs: nfs4.fattr4 | None = None) -> nfs4.openflag4:
    return nfs4.openflag4(
        nfs4.OPEN4_CREATE, nfs4.createhow4(nfs4.UNCHECKED4, attrs or mode_attrs())
    )


NOCREATE = nfs4.openflag4(nfs4.OPEN4_NOCREATE)


def claim_null(name: bytes) -> nfs4.open_claim4:
    return nfs4.open_claim4(nfs4.CLAIM_NULL, name)


def open_op(
    name: bytes | None,
    access: int = BOTH,
    deny: int = DENY_NONE,
    how: nfs4.openflag4 | None = None,
    owner: bytes = b"owner",
    claim: nfs4.open_claim4 | None = None,
) -> nfs4.nfs_argop4:
    if claim is None:
        assert name is not None
        claim = claim_null(name)
    return op(
        nfs4.OP_OPEN,
        nfs4.OPEN4args(
            0,
            access,
            deny,
            nfs4.state_owner4(0, owner),
            how or unchecked(),
            claim,
        ),
    )


class Nfs:
    """One NFSv4.1 client (its own client id) with helpers that check statuses."""

    def __init__(self, session: ClientSession, server: NFSServer) -> None:
        self.s = session
        self.server = server
        self.root = b""

    async def call(self, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        return await self.s.compound(list(ops))

    async def expect(self, status: int, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        res = await self.call(*ops)
        assert name_of(res.status) == name_of(status), [
            (r.resop.name, name_of(getattr(r.value, dataclasses.fields(r.value)[0].name)))
            for r in res.resarray
        ]
        return res

    async def open(
        self, name: bytes, access: int = BOTH, deny: int = DENY_NONE, **kw: Any
    ) -> tuple[bytes, nfs4.stateid4, nfs4.OPEN4resok]:
        res = await self.expect(
            OK, op(nfs4.OP_PUTROOTFH), open_op(name, access, deny, **kw), op(nfs4.OP_GETFH)
        )
        ok = res.resarray[1].value.value
        return res.resarray[2].value.value.object, ok.stateid, ok

    async def write(
        self, fh: bytes, sid: nfs4.stateid4, offset: int, data: bytes, stable: int = 0
    ) -> nfs4.WRITE4resok:
        res = await self.expect(
            OK,
            op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
            op(nfs4.OP_WRITE, nfs4.WRITE4args(sid, offset, nfs4.stable_how4(stable), data)),
        )
        return res.resarray[1].value.value

    async def read(
        self, fh: bytes, sid: nfs4.stateid4, offset: int, count: int
    ) -> tuple[bytes, bool]:
        res = await self.expect(
            OK,
            op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
            op(nfs4.OP_READ, nfs4.READ4args(sid, offset, count)),
        )
        ok = res.resarray[1].value.value
        return bytes(ok.data), ok.eof

    async def on(self, fh: bytes, status: int, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        """PUTFH fh + ops, expecting ``status``; returns the last result's value."""
        return await self.expect(status, op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)), *ops)

    async def close(self, fh: bytes, sid: nfs4.stateid4) -> None:
        await self.on(fh, OK, op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid)))

    def lock_new(
        self, open_sid: nfs4.stateid4, owner: bytes, offset: int, length: int, kind: int = 2
    ) -> nfs4.nfs_argop4:
        locker = nfs4.locker4(
            True, nfs4.open_to_lock_owner4(0, open_sid, 0, nfs4.state_owner4(0, owner))
        )
        return op(
            nfs4.OP_LOCK, nfs4.LOCK4args(nfs4.nfs_lock_type4(kind), False, offset, length, locker)
        )

    def lock_more(
        self, lock_sid: nfs4.stateid4, offset: int, length: int, kind: int = 2
    ) -> nfs4.nfs_argop4:
        locker = nfs4.locker4(False, nfs4.exist_lock_owner4(lock_sid, 0))
        return op(
            nfs4.OP_LOCK, nfs4.LOCK4args(nfs4.nfs_lock_type4(kind), False, offset, length, locker)
        )

    @staticmethod
    def unlock(lock_sid: nfs4.stateid4, offset: int, length: int) -> nfs4.nfs_argop4:
        return op(nfs4.OP_LOCKU, nfs4.LOCKU4args(nfs4.WRITE_LT, 0, lock_sid, offset, length))

    @property
    def clientid(self) -> int:
        assert self.s.clientid is not None
        return self.s.clientid


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path,
    clients: int = 1,
    config: ServerConfig | None = None,
    backchannel: bool = False,
    delay_deadline: float = 60.0,
) -> AsyncIterator[tuple[NFSServer, list[Nfs]]]:
    export = tmp_path / "export"
    export.mkdir(exist_ok=True)
    cfg = config or ServerConfig(large_io=LARGE_IO)
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
        config=cfg,
    )
    await server.start()
    port = server.tcp_port
    sessions: list[ClientSession] = []
    try:
        for i in range(clients):
            s = ClientSession(
                lambda: connect_tcp("127.0.0.1", port),
                SessionOptions(
                    backchannel=backchannel,
                    owner=f"test-client-{i}".encode(),
                    delay_deadline=delay_deadline,
                ),
            )
            await s.start()
            sessions.append(s)
        yield server, [Nfs(s, server) for s in sessions]
    finally:
        for s in sessions:
            await s.close()
        await server.close()


# ---------------------------------------------------------------- the data path


async def test_open_write_commit_read_close(tmp_path: Path) -> None:
    async with served(tmp_path) as (server, (c,)):
        fh, sid, ok = await c.open(b"f")
        assert ok.stateid.seqid == 1
        may_notify = nfs4.OPEN4_RESULT_MAY_NOTIFY_LOCK  # CB_NOTIFY_LOCK is sent (20.11)
        assert ok.rflags == nfs4.OPEN4_RESULT_LOCKTYPE_POSIX | may_notify
        assert not ok.rflags & nfs4.OPEN4_RESULT_CONFIRM  # SS-30
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE
        assert ok.attrset == bitmap_of([nfs4.FATTR4_MODE])
        assert ok.cinfo.after != ok.cinfo.before  # the directory changed
        verifier = server.state.vfs.write_verifier  # type: ignore[union-attr]
        w = await c.write(fh, sid, 0, b"hello ", stable=nfs4.UNSTABLE4)
        assert (w.count, w.committed, w.writeverf) == (6, nfs4.UNSTABLE4, verifier)
        w = await c.write(fh, sid, 6, b"world", stable=nfs4.DATA_SYNC4)
        assert (w.count, w.committed) == (5, nfs4.FILE_SYNC4)
        res = await c.on(fh, OK, op(nfs4.OP_COMMIT, nfs4.COMMIT4args(0, 0)))
        assert res.resarray[1].value.value.writeverf == verifier
        assert await c.read(fh, sid, 0, 100) == (b"hello world", True)
        assert await c.read(fh, sid, 0, 5) == (b"hello", False)
        assert await c.read(fh, sid, 11, 10) == (b"", True)  # at EOF
        assert await c.read(fh, sid, 1 << 63, 10) == (b"", True)  # far beyond it
        assert (tmp_path / "export" / "f").read_bytes() == b"hello world"
        res = await c.on(fh, OK, op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid)))
        closed = res.resarray[1].value.value
        assert (closed.seqid, closed.other) == (0xFFFFFFFF, bytes(12))  # the invalid stateid
        await c.on(fh, nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_READ, nfs4.READ4args(sid, 0, 1)))
        assert server.state.state_manager.stateid_count == 0  # type: ignore[union-attr]


async def test_large_io_goes_through_the_thread_pool(tmp_path: Path) -> None:
    """READ/WRITE of at least large_io octets run in the executor; the data is intact and
    READ is capped at max_io."""
    cfg = ServerConfig(large_io=LARGE_IO, max_io=1 << 18)
    async with served(tmp_path, config=cfg) as (server, (c,)):
        assert server.state is not None
        threads: set[str] = set()
        real_write = server.state.vfs.open

        def spy_open(*a: Any, **kw: Any) -> Any:
            of = real_write(*a, **kw)
            orig_write, orig_readinto = of.write, of.readinto

            def write(*wa: Any, **wk: Any) -> Any:
                import threading

                threads.add(threading.current_thread().name)
                return orig_write(*wa, **wk)

            def readinto(*ra: Any, **rk: Any) -> Any:
                import threading

                threads.add(threading.current_thread().name)
                return orig_readinto(*ra, **rk)

            of.write, of.readinto = write, readinto
            return of

        server.state.vfs.open = spy_open  # type: ignore[method-assign]
        fh, sid, _ = await c.open(b"big")
        await c.close(fh, sid)
        fh, sid, _ = await c.open(b"big", how=NOCREATE)
        blob = os.urandom(300_000)
        w = await c.write(fh, sid, 0, blob, stable=nfs4.FILE_SYNC4)
        assert w.count == len(blob)
        data, eof = await c.read(fh, sid, 0, len(blob))
        assert data == blob[: 1 << 18] and not eof  # capped at max_io
        data, eof = await c.read(fh, sid, 1 << 18, 1 << 18)
        assert data == blob[1 << 18 :] and eof
        assert threads and all(t.startswith("nfsrdma-io") for t in threads), threads


async def test_a_long_readdir_leaves_the_loop_to_other_clients(tmp_path: Path) -> None:
    """A READDIR of a large directory lists all but its first readdir_inline entries in the
    thread pool: while that part is held there, another client's COMPOUND is answered (on the
    event loop it would have to wait), and the listing is complete once let go."""
    cfg = ServerConfig(large_io=LARGE_IO, readdir_inline=32)
    async with served(tmp_path, clients=2, config=cfg) as (server, (a, b)):
        assert server.state is not None
        names = {f"n{i:03d}" for i in range(200)}
        for n in names:
            (tmp_path / "export" / n).write_bytes(b"")
        loop = asyncio.get_running_loop()
        held, release = asyncio.Event(), threading.Event()
        real = server.state.vfs.readdir

        def holding(*args: Any, **kw: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():  # the pool's part
                loop.call_soon_threadsafe(held.set)
                release.wait(60)
            return real(*args, **kw)

        server.state.vfs.readdir = holding  # type: ignore[method-assign]
        readdir = op(
            nfs4.OP_READDIR,
            nfs4.READDIR4args(0, bytes(8), 0, 1 << 20, bitmap_of([nfs4.FATTR4_TYPE])),
        )
        listing = asyncio.create_task(a.expect(OK, op(nfs4.OP_PUTROOTFH), readdir))
        try:
            await asyncio.wait_for(held.wait(), 20)
            getattr_op = op(nfs4.OP_GETATTR, nfs4.GETATTR4args(bitmap_of([nfs4.FATTR4_SIZE])))
            await asyncio.wait_for(b.expect(OK, op(nfs4.OP_PUTROOTFH), getattr_op), 20)
            assert not listing.done()
        finally:
            release.set()
        reply = (await listing).resarray[-1].value.value.reply
        assert reply.eof and {e.name.decode() for e in reply.entries} == names


async def test_current_stateid_in_one_compound(tmp_path: Path) -> None:
    """RFC 8881 16.2.3.1.2: OPEN sets the current stateid, which WRITE/READ/CLOSE use."""
    async with served(tmp_path) as (_, (c,)):
        res = await c.expect(
            OK,
            op(nfs4.OP_PUTROOTFH),
            open_op(b"cur"),
            op(nfs4.OP_WRITE, nfs4.WRITE4args(CURRENT_STATEID, 0, nfs4.FILE_SYNC4, b"abc")),
            op(nfs4.OP_READ, nfs4.READ4args(CURRENT_STATEID, 0, 10)),
            op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, CURRENT_STATEID)),
        )
        assert bytes(res.resarray[3].value.value.data) == b"abc"
        # PUTFH clears the current stateid
        fh = (await c.open(b"cur"))[0]
        await c.on(
            fh, nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_READ, nfs4.READ4args(CURRENT_STATEID, 0, 1))
        )


async def test_special_stateids_do_anonymous_io(tmp_path: Path) -> None:
    async with served(tmp_path, clients=2) as (_, (a, b)):
        fh, sid, _ = await a.open(b"anon")
        await a.write(fh, ANONYMOUS_STATEID, 0, b"anonymous")
        assert await a.read(fh, ANONYMOUS_STATEID, 0, 20) == (b"anonymous", True)
        assert await a.read(fh, BYPASS_STATEID, 0, 4) == (b"anon", False)
        await a.close(fh, sid)
        # share deny of another client's open: anonymous I/O is refused with LOCKED,
        # the READ bypass stateid is not
        fh, sid, _ = await b.open(b"anon", READ, DENY_READ | DENY_WRITE, how=NOCREATE)
        w = nfs4.WRITE4args(ANONYMOUS_STATEID, 0, nfs4.UNSTABLE4, b"x")
        await a.on(fh, nfs4.NFS4ERR_LOCKED, op(nfs4.OP_WRITE, w))
        r = nfs4.READ4args(ANONYMOUS_STATEID, 0, 4)
        await a.on(fh, nfs4.NFS4ERR_LOCKED, op(nfs4.OP_READ, r))
        assert await a.read(fh, BYPASS_STATEID, 0, 4) == (b"anon", False)


# ---------------------------------------------------------------- OPEN variants


async def test_open_create_modes(tmp_path: Path) -> None:
    async with served(tmp_path) as (_, (c,)):
        root = op(nfs4.OP_PUTROOTFH)
        guarded = nfs4.openflag4(nfs4.OPEN4_CREATE, nfs4.createhow4(nfs4.GUARDED4, mode_attrs()))
        fh, sid, _ = await c.open(b"g", how=guarded)
        await c.expect(nfs4.NFS4ERR_EXIST, root, open_op(b"g", how=guarded, owner=b"o2"))
        # EXCLUSIVE4_1: a retry with the same verifier succeeds, another verifier is EXIST
        excl = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(b"verifier", mode_attrs(0o600))),
        )
        fh1, sid1, ok1 = await c.open(b"x", how=excl)
        assert ok1.attrset == bitmap_of([nfs4.FATTR4_MODE])
        fh2, sid2, _ = await c.open(b"x", how=excl)
        assert fh2 == fh1 and sid2.other == sid1.other and sid2.seqid == 2
        other = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(b"other-vf", no_attrs())),
        )
        await c.expect(nfs4.NFS4ERR_EXIST, root, open_op(b"x", how=other, owner=b"o2"))
        # EXCLUSIVE4 is NFSv4.0's; time_modify_set cannot go with EXCLUSIVE4_1
        v40 = nfs4.openflag4(nfs4.OPEN4_CREATE, nfs4.createhow4(nfs4.EXCLUSIVE4, b"verifier"))
        await c.expect(nfs4.NFS4ERR_INVAL, root, open_op(b"y", how=v40))
        mtime = nfs4.fattr4(bitmap_of([nfs4.FATTR4_TIME_MODIFY_SET]), (0).to_bytes(4, "big"))
        bad = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(b"verifier", mtime)),
        )
        await c.expect(nfs4.NFS4ERR_INVAL, root, open_op(b"y", how=bad))
        assert not (tmp_path / "export" / "y").exists()
        # UNCHECKED4 with size 0 truncates an existing file
        await c.write(fh, sid, 0, b"some data")
        _, sid3, ok3 = await c.open(b"g", how=unchecked(mode_attrs(size=0)))
        assert ok3.attrset == bitmap_of([nfs4.FATTR4_SIZE])
        assert (tmp_path / "export" / "g").read_bytes() == b""
        assert sid3.other == sid.other and sid3.seqid == 2  # same owner: an upgrade


async def test_open_claims_and_errors(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "dir").mkdir()
    (export / "file").write_bytes(b"content")
    os.symlink("file", export / "link")
    async with served(tmp_path) as (_, (c,)):
        root = op(nfs4.OP_PUTROOTFH)
        cases = [
            (b"missing", NOCREATE, nfs4.NFS4ERR_NOENT),
            (b"dir", NOCREATE, nfs4.NFS4ERR_ISDIR),
            (b"link", NOCREATE, nfs4.NFS4ERR_SYMLINK),
            (b"dir", unchecked(), nfs4.NFS4ERR_ISDIR),
            (b"..", NOCREATE, nfs4.NFS4ERR_BADNAME),
            (b"", NOCREATE, nfs4.NFS4ERR_INVAL),
            (b"\xff\xfe", NOCREATE, nfs4.NFS4ERR_INVAL),
        ]
        for name, how, status in cases:
            await c.expect(status, root, open_op(name, how=how))
        await c.expect(nfs4.NFS4ERR_INVAL, root, open_op(b"file", access=0, how=NOCREATE))
        await c.expect(nfs4.NFS4ERR_INVAL, root, open_op(b"file", deny=4, how=NOCREATE))
        await c.expect(nfs4.NFS4ERR_NOFILEHANDLE, open_op(b"file", how=NOCREATE))
        fh, sid, _ = await c.open(b"file", READ, how=NOCREATE)
        # CLAIM_NULL needs a directory (NFS4ERR_SYMLINK for a symbolic link)
        await c.on(fh, nfs4.NFS4ERR_NOTDIR, open_op(b"x", how=NOCREATE))
        link_fh = (
            (
                await c.expect(
                    OK, root, op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"link")), op(nfs4.OP_GETFH)
                )
            )
            .resarray[2]
            .value.value.object
        )
        await c.on(link_fh, nfs4.NFS4ERR_SYMLINK, open_op(b"x", how=NOCREATE))
        # CLAIM_FH: the current filehandle is the file (no create with it)
        fh_claim = nfs4.open_claim4(nfs4.CLAIM_FH)
        res = await c.on(fh, OK, open_op(None, READ, how=NOCREATE, owner=b"o2", claim=fh_claim))
        assert res.resarray[1].value.value.stateid.other != sid.other
        await c.on(fh, nfs4.NFS4ERR_INVAL, open_op(None, claim=fh_claim, owner=b"o3"))
        dir_fh = (
            (
                await c.expect(
                    OK, root, op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"dir")), op(nfs4.OP_GETFH)
                )
            )
            .resarray[2]
            .value.value.object
        )
        await c.on(dir_fh, nfs4.NFS4ERR_ISDIR, open_op(None, how=NOCREATE, claim=fh_claim))
        # no state survives a restart, there is no grace period, and no delegations
        prev = nfs4.open_claim4(nfs4.CLAIM_PREVIOUS, nfs4.OPEN_DELEGATE_NONE)
        await c.on(fh, nfs4.NFS4ERR_NO_GRACE, open_op(None, how=NOCREATE, claim=prev))
        dprev = nfs4.open_claim4(nfs4.CLAIM_DELEGATE_PREV, b"file")
        await c.expect(nfs4.NFS4ERR_NOTSUPP, root, open_op(None, how=NOCREATE, claim=dprev))
        dcur = nfs4.open_claim4(nfs4.CLAIM_DELEG_CUR_FH, sid)
        await c.on(fh, nfs4.NFS4ERR_BAD_STATEID, open_op(None, how=NOCREATE, claim=dcur))
        await c.on(
            fh,
            nfs4.NFS4ERR_BAD_STATEID,
            op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(sid)),
        )
        await c.expect(
            nfs4.NFS4ERR_NOTSUPP, op(nfs4.OP_DELEGPURGE, nfs4.DELEGPURGE4args(c.clientid))
        )


async def test_open_create_errors_of_the_directory_come_first(tmp_path: Path) -> None:
    """OPEN with a create (one VFS call for the directory's checks, the create and its
    change_info): a file or symlink as the current filehandle is NFS4ERR_NOTDIR or
    NFS4ERR_SYMLINK, before the createattrs' NFS4ERR_INVAL; nothing is created."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "file").write_bytes(b"content")
    os.symlink("file", export / "link")
    async with served(tmp_path) as (_, (c,)):
        mtime = nfs4.fattr4(bitmap_of([nfs4.FATTR4_TIME_MODIFY_SET]), (0).to_bytes(4, "big"))
        bad = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(b"verifier", mtime)),
        )
        excl = nfs4.openflag4(
            nfs4.OPEN4_CREATE,
            nfs4.createhow4(nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(b"verifier", mode_attrs())),
        )
        for name, status in ((b"file", nfs4.NFS4ERR_NOTDIR), (b"link", nfs4.NFS4ERR_SYMLINK)):
            lookup = op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name))
            res = await c.expect(OK, op(nfs4.OP_PUTROOTFH), lookup, op(nfs4.OP_GETFH))
            fh = res.resarray[2].value.value.object
            for how in (unchecked(), excl, bad):
                await c.on(fh, status, open_op(b"x", how=how))
        root = op(nfs4.OP_PUTROOTFH)
        await c.expect(nfs4.NFS4ERR_INVAL, root, open_op(b"x", how=bad))
        assert sorted(os.listdir(export)) == ["file", "link"]
        res = await c.expect(OK, root, open_op(b"x", how=excl))
        cinfo = res.resarray[1].value.value.cinfo
        assert cinfo.before != cinfo.after and not cinfo.atomic


async def test_delegation_wants_are_answered(tmp_path: Path) -> None:
    """RFC 8881 18.16.3: OPEN_DELEGATE_NONE_EXT says why when a want was expressed (a client
    without a back channel gets no delegation: WND4_RESOURCE)."""
    async with served(tmp_path) as (_, (c,)):
        expected = {
            0: (nfs4.OPEN_DELEGATE_NONE, None),
            nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG: (
                nfs4.OPEN_DELEGATE_NONE_EXT,
                nfs4.WND4_NOT_WANTED,
            ),
            nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG: (
                nfs4.OPEN_DELEGATE_NONE_EXT,
                nfs4.WND4_RESOURCE,
            ),
            nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG: (
                nfs4.OPEN_DELEGATE_NONE_EXT,
                nfs4.WND4_RESOURCE,
            ),
            nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL: (nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.WND4_CANCELLED),
        }
        for i, (want, (dtype, why)) in enumerate(expected.items()):
            _, _, ok = await c.open(b"d", BOTH | want, owner=b"o%d" % i)
            assert ok.delegation.delegation_type == dtype
            if why is not None:
                assert ok.delegation.value.ond_why == why
        await c.expect(nfs4.NFS4ERR_INVAL, op(nfs4.OP_PUTROOTFH), open_op(b"d", BOTH | 0x0600))


async def test_share_reservations_between_clients(tmp_path: Path) -> None:
    async with served(tmp_path, clients=2) as (_, (a, b)):
        root = op(nfs4.OP_PUTROOTFH)
        fh, sa, _ = await a.open(b"s", READ, DENY_WRITE)
        await b.expect(nfs4.NFS4ERR_SHARE_DENIED, root, open_op(b"s", WRITE, how=NOCREATE))
        await b.expect(
            nfs4.NFS4ERR_SHARE_DENIED, root, open_op(b"s", READ, DENY_READ, how=NOCREATE)
        )
        await b.open(b"s", READ, how=NOCREATE)
        # A may not deny READ now that B reads; A upgrading itself to WRITE is fine
        await a.expect(nfs4.NFS4ERR_SHARE_DENIED, root, open_op(b"s", READ, DENY_READ))
        _, sa2, _ = await a.open(b"s", WRITE)
        assert sa2.other == sa.other and sa2.seqid == 2
        # the old seqid is now OLD_STATEID; seqid 0 means "current"
        await a.on(fh, nfs4.NFS4ERR_OLD_STATEID, op(nfs4.OP_READ, nfs4.READ4args(sa, 0, 1)))
        await a.read(fh, nfs4.stateid4(0, sa.other), 0, 1)
        # OPEN_DOWNGRADE to READ (a subset of the opens in effect), then WRITE is refused
        res = await a.on(
            fh,
            OK,
            op(nfs4.OP_OPEN_DOWNGRADE, nfs4.OPEN_DOWNGRADE4args(sa2, 0, READ, DENY_WRITE)),
        )
        sa3 = res.resarray[1].value.value.open_stateid
        assert sa3.seqid == 3
        w = nfs4.WRITE4args(sa3, 0, nfs4.UNSTABLE4, b"x")
        await a.on(fh, nfs4.NFS4ERR_OPENMODE, op(nfs4.OP_WRITE, w))
        await a.on(
            fh,
            nfs4.NFS4ERR_INVAL,
            op(nfs4.OP_OPEN_DOWNGRADE, nfs4.OPEN_DOWNGRADE4args(sa3, 0, BOTH, 0)),
        )
        await a.close(fh, sa3)
        _, sb2, _ = await b.open(b"s", WRITE, how=NOCREATE)  # no deny left
        await b.write(fh, sb2, 0, b"ok")


async def test_bad_stateids_of_every_kind(tmp_path: Path) -> None:
    async with served(tmp_path, clients=2) as (server, (a, b)):
        assert server.state is not None
        fh, sid, _ = await a.open(b"f")
        fh2, _, _ = await a.open(b"g")
        other = sid.other
        prefix = server.state.state_manager.instance
        cases = {
            "stale": (nfs4.stateid4(1, bytes(b ^ 0xFF for b in prefix) + other[4:]), a, fh),
            "unknown": (nfs4.stateid4(1, prefix + b"\x7f" * 8), a, fh),
            "newer seqid": (nfs4.stateid4(2, other), a, fh),
            "another file": (sid, a, fh2),
            "another client": (sid, b, fh),
            "invalid special": (nfs4.stateid4(0xFFFFFFFF, bytes(12)), a, fh),
            "zero other, seqid 7": (nfs4.stateid4(7, bytes(12)), a, fh),
        }
        for what, (bad, client, f) in cases.items():
            want = nfs4.NFS4ERR_STALE_STATEID if what == "stale" else nfs4.NFS4ERR_BAD_STATEID
            for args in (
                op(nfs4.OP_READ, nfs4.READ4args(bad, 0, 1)),
                op(nfs4.OP_WRITE, nfs4.WRITE4args(bad, 0, nfs4.UNSTABLE4, b"x")),
                op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, bad)),
                op(nfs4.OP_LOCKU, nfs4.LOCKU4args(nfs4.READ_LT, 0, bad, 0, 1)),
                op(nfs4.OP_OPEN_DOWNGRADE, nfs4.OPEN_DOWNGRADE4args(bad, 0, READ, 0)),
            ):
                await client.on(f, want, args)
        # an open stateid is not a lock stateid, and the other way round
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, Nfs.unlock(sid, 0, 1))
        res = await a.on(fh, OK, a.lock_new(sid, b"lo", 0, 1))
        lsid = res.resarray[1].value.value.lock_stateid
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, a.lock_new(lsid, b"lo2", 0, 1))
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, lsid)))
        # TEST_STATEID: one status per stateid
        res = await a.call(
            op(
                nfs4.OP_TEST_STATEID,
                nfs4.TEST_STATEID4args(
                    [
                        sid,
                        lsid,
                        cases["stale"][0],
                        cases["unknown"][0],
                        ANONYMOUS_STATEID,
                        nfs4.stateid4(5, other),
                    ]
                ),
            )
        )
        codes = [name_of(s) for s in res.resarray[0].value.value.tsr_status_codes]
        assert codes == [
            "NFS4_OK",
            "NFS4_OK",
            "NFS4ERR_BAD_STATEID",
            "NFS4ERR_BAD_STATEID",
            "NFS4ERR_BAD_STATEID",
            "NFS4ERR_BAD_STATEID",
        ]
        res = await b.call(op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([sid])))
        assert res.resarray[0].value.value.tsr_status_codes == [nfs4.NFS4ERR_BAD_STATEID]


# ---------------------------------------------------------------- byte-range locks


async def test_locks_between_two_clients(tmp_path: Path) -> None:
    async with served(tmp_path, clients=2) as (server, (a, b)):
        fh, sa, _ = await a.open(b"l")
        _, sb, _ = await b.open(b"l", how=NOCREATE)
        res = await a.on(fh, OK, a.lock_new(sa, b"pidA", 0, 100))
        la = res.resarray[1].value.value.lock_stateid
        assert la.seqid == 1 and la.other != sa.other
        # B overlapping: DENIED with A's lock
        res = await b.on(fh, nfs4.NFS4ERR_DENIED, b.lock_new(sb, b"pidB", 50, MAX, kind=1))
        denied = res.resarray[1].value.value
        assert (denied.offset, denied.length, denied.locktype) == (0, 100, nfs4.WRITE_LT)
        assert denied.owner == nfs4.state_owner4(a.clientid, b"pidA")
        lockt = nfs4.LOCKT4args(nfs4.READ_LT, 99, 1, nfs4.state_owner4(0, b"pidB"))
        res = await b.on(fh, nfs4.NFS4ERR_DENIED, op(nfs4.OP_LOCKT, lockt))
        assert res.resarray[1].value.value.offset == 0
        # blocking variant: same answer (the client polls)
        await b.on(fh, nfs4.NFS4ERR_DENIED, b.lock_new(sb, b"pidB", 0, 1, kind=nfs4.WRITEW_LT))
        # A tests its own range: no conflict with itself
        own = nfs4.LOCKT4args(nfs4.WRITE_LT, 0, 10, nfs4.state_owner4(0, b"pidA"))
        await a.on(fh, OK, op(nfs4.OP_LOCKT, own))
        # A unlocks the middle: B may lock there, not at the edges
        res = await a.on(fh, OK, Nfs.unlock(la, 40, 20))
        la = res.resarray[1].value.value
        assert la.seqid == 2
        res = await b.on(fh, OK, b.lock_new(sb, b"pidB", 45, 10))
        lb = res.resarray[1].value.value.lock_stateid
        await b.on(fh, nfs4.NFS4ERR_DENIED, b.lock_more(lb, 30, 11))
        # A may not CLOSE while holding locks; B's stateid is useless to A
        await a.on(fh, nfs4.NFS4ERR_LOCKS_HELD, op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sa)))
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, Nfs.unlock(lb, 0, MAX))
        # FREE_STATEID refuses while locks are held, then frees
        free = op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(la))
        await a.expect(nfs4.NFS4ERR_LOCKS_HELD, free)
        res = await a.on(fh, OK, Nfs.unlock(la, 0, MAX))
        la = res.resarray[1].value.value
        await a.expect(OK, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(la)))
        await a.expect(
            nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(la))
        )
        await a.expect(
            nfs4.NFS4ERR_LOCKS_HELD, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(sa))
        )
        await a.close(fh, sa)
        # B now gets the whole file
        res = await b.on(fh, OK, b.lock_more(lb, 0, MAX))
        # client B goes away: its locks and opens go with it
        assert server.state is not None
        server.state.state_manager.client_expired(b.clientid)
        _, sa2, _ = await a.open(b"l", how=NOCREATE)
        await a.on(fh, OK, a.lock_new(sa2, b"pidA", 0, MAX))


async def test_lock_argument_errors(tmp_path: Path) -> None:
    async with served(tmp_path) as (_, (c,)):
        fh, sid, _ = await c.open(b"e", READ)
        for offset, length in ((0, 0), (3, MAX - 1)):
            await c.on(fh, nfs4.NFS4ERR_INVAL, c.lock_new(sid, b"p", offset, length, kind=1))
        # a write lock on a read-only open
        await c.on(fh, nfs4.NFS4ERR_OPENMODE, c.lock_new(sid, b"p", 0, 1, kind=2))
        # reclaims: no grace period
        locker = nfs4.locker4(True, nfs4.open_to_lock_owner4(0, sid, 0, nfs4.state_owner4(0, b"p")))
        reclaim = op(nfs4.OP_LOCK, nfs4.LOCK4args(nfs4.READ_LT, True, 0, 1, locker))
        await c.on(fh, nfs4.NFS4ERR_NO_GRACE, reclaim)
        # upgrade / downgrade of a range and LOCKU through the current stateid
        res = await c.on(
            fh, OK, c.lock_new(sid, b"p", 0, 10, kind=1), Nfs.unlock(CURRENT_STATEID, 0, 5)
        )
        assert res.resarray[2].value.value.seqid == 2
        dir_fh = (
            (await c.expect(OK, op(nfs4.OP_PUTROOTFH), op(nfs4.OP_GETFH)))
            .resarray[1]
            .value.value.object
        )
        lockt = nfs4.LOCKT4args(nfs4.READ_LT, 0, 1, nfs4.state_owner4(0, b"p"))
        await c.on(dir_fh, nfs4.NFS4ERR_ISDIR, op(nfs4.OP_LOCKT, lockt))


async def test_concurrent_writers_and_lockers(tmp_path: Path) -> None:
    """Four clients write distinct files concurrently while two more take turns on one file
    under a whole-file write lock (what fcntl locking from two Linux processes looks like)."""
    async with served(tmp_path, clients=6) as (_, clients):
        writers, lockers = clients[:4], clients[4:]
        chunk = 8192

        async def writer(i: int, c: Nfs) -> None:
            fh, sid, _ = await c.open(b"w%d" % i)
            for k in range(16):
                await c.write(fh, sid, k * chunk, bytes([i]) * chunk)
            await c.on(fh, OK, op(nfs4.OP_COMMIT, nfs4.COMMIT4args(0, 0)))
            await c.close(fh, sid)

        async def locker(i: int, c: Nfs) -> None:
            fh, sid, _ = await c.open(b"shared")
            lock_sid: nfs4.stateid4 | None = None
            for _ in range(10):
                while True:
                    lk = (
                        c.lock_new(sid, b"proc", 0, MAX)
                        if lock_sid is None
                        else c.lock_more(lock_sid, 0, MAX)
                    )
                    res = await c.call(op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)), lk)
                    if res.status == OK:
                        lock_sid = res.resarray[1].value.value.lock_stateid
                        break
                    assert res.status == nfs4.NFS4ERR_DENIED
                    await asyncio.sleep(0.001)
                # read-modify-write a counter under the lock
                data, _ = await c.read(fh, sid, 0, 8)
                n = int.from_bytes(data or bytes(8), "big")
                await asyncio.sleep(0)
                await c.write(fh, sid, 0, (n + 1).to_bytes(8, "big"), stable=nfs4.FILE_SYNC4)
                res = await c.on(fh, OK, Nfs.unlock(lock_sid, 0, MAX))
                lock_sid = res.resarray[1].value.value
            await c.expect(OK, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(lock_sid)))
            await c.close(fh, sid)

        started = time.monotonic()
        await asyncio.gather(
            *(writer(i, c) for i, c in enumerate(writers)),
            *(locker(i, c) for i, c in enumerate(lockers)),
        )
        elapsed = time.monotonic() - started
        export = tmp_path / "export"
        for i in range(4):
            assert (export / f"w{i}").read_bytes() == bytes([i]) * chunk * 16
        assert int.from_bytes((export / "shared").read_bytes(), "big") == 20
        assert elapsed < 30


async def test_client_expiry_through_the_session_layer(tmp_path: Path) -> None:
    """DESTROY_CLIENTID / lease expiry reach StateManager.client_expired (wired by the
    server): the other client can then open with a deny and lock."""
    async with served(tmp_path, clients=2) as (server, (a, b)):
        fh, sa, _ = await a.open(b"x", BOTH, DENY_WRITE)
        await a.on(fh, OK, a.lock_new(sa, b"p", 0, MAX))
        assert server.state is not None
        sessions = server.state.sessions
        cid = a.clientid
        sessions.on_client_expired(cid)
        assert not server.state.state_manager.client_has_state(cid)
        _, sb, _ = await b.open(b"x", BOTH, DENY_WRITE, how=NOCREATE)
        await b.on(fh, OK, b.lock_new(sb, b"q", 0, MAX))


async def test_blocked_lock_owner_is_notified_by_cb_notify_lock(tmp_path: Path) -> None:
    """RFC 8881 20.11: a refused blocking lock (WRITEW_LT) gets CB_NOTIFY_LOCK, with
    CB_SEQUENCE, on the waiter's back channel once the conflicting lock goes (UL-22)."""
    async with served(tmp_path, clients=2, backchannel=True) as (server, (a, b)):
        no_deleg = BOTH | nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG  # only lock callbacks here
        fh, sa, _ = await a.open(b"contended", no_deleg)
        _, sb, _ = await b.open(b"contended", no_deleg)
        res = await a.on(fh, OK, a.lock_new(sa, b"pidA", 0, 100))
        la = res.resarray[1].value.value.lock_stateid
        await b.on(fh, nfs4.NFS4ERR_DENIED, b.lock_new(sb, b"pidB", 0, 100, nfs4.WRITEW_LT))
        before = b.s.stats.callbacks
        notified = asyncio.ensure_future(b.s.wait_lock_notice(fh, b"pidB", 10))
        await a.on(fh, OK, a.unlock(la, 0, 100))
        assert server.callbacks is not None
        assert await notified, "no CB_NOTIFY_LOCK for (fh, pidB) within 10 s"
        assert b.s.stats.callbacks == before + 1
        assert server.callbacks.sent == 1 and server.callbacks.failed == 0
        # The waiter takes the lock now; no further notification is pending.
        await b.on(fh, OK, b.lock_new(sb, b"pidB", 0, 100, nfs4.WRITEW_LT))


async def test_courteous_expiry_is_wired_in_the_real_server(tmp_path: Path) -> None:
    """NFSServer wires courtesy (issue 11 section 3): the reaper, run past A's lease, keeps
    A's state; B's OPEN refused only by it expires A and succeeds."""
    async with served(tmp_path, clients=2) as (server, (a, b)):
        assert server.state is not None
        sessions = server.state.sessions
        await a.open(b"c", BOTH, DENY_WRITE)
        lease = server.config.lease_time
        assert sessions.reap(time.monotonic() + lease + 1) == []  # B: within its slack
        assert sessions.courteous(a.clientid) and not sessions.courteous(b.clientid)
        assert server.state.state_manager.client_has_state(a.clientid)
        await b.open(b"c", WRITE, how=NOCREATE)
        assert sessions.client(a.clientid) is None
        assert not server.state.state_manager.client_has_state(a.clientid)
