"""Server CPU per COMPOUND through the whole server path, in process, on the host.

Each request enters as record-marked bytes at ``TcpConnection.data_received`` (record parser),
goes through ``RpcConnection`` and the ``Dispatcher`` (RPC header, AUTH_SYS credential) into the
COMPOUND processor and the real local VFS over a temporary directory, and its reply leaves as
record-marked buffers through ``TcpConnection``'s send path into an in-process transport that
keeps nothing (no socket, no kernel). Every COMPOUND uses the next sequence id of one slot, so
every one runs (no reply-cache hit), and every reply is checked to be NFS4_OK.

Shapes: SEQUENCE+PUTFH+READ(4 KiB) (``read_us``), SEQUENCE+PUTFH+GETATTR of the Linux client's
attributes (``getattr_us``), and an OPEN (no create) / CLOSE pair: SEQUENCE+PUTFH+OPEN+GETFH
then SEQUENCE+PUTFH+CLOSE (``openclose_us``: per COMPOUND, the pair's time halved).
The ``meta`` shape is the Linux client's create/stat/remove of one file (``bench/nfsbench.py``'s
meta phase), four COMPOUNDs as that client sends them, in a subdirectory ``meta`` of the
export as nfsbench.py's: SEQUENCE+PUTFH+OPEN(EXCLUSIVE4_1 create, mode)+GETFH+ACCESS+GETATTR; SEQUENCE+PUTFH+CLOSE+GETATTR; SEQUENCE+PUTFH+LOOKUP+GETFH+GETATTR
(the stat after the client dropped its caches); SEQUENCE+PUTFH+REMOVE (``meta_us``: per
COMPOUND, and ``meta_handoffs``: VFS calls handed to the identity worker per COMPOUND,
vfs/identity.py). As the test bed runs the server, ``--protect`` marks the loop thread as the
server does (it drives RDMA: a call for another identity runs in the identity worker),
``--caller UID:GID:GIDS`` sets the AUTH_SYS credential (default ``0:0:``, root with no
supplementary groups, as the Linux client's machine credential) and ``--root-squash`` squashes
root (as ``nfsbench.py --root-squash``).
Figures are process CPU microseconds per COMPOUND, median of ``--repeat`` measures (robust on a
shared machine). Then ``--rss-count`` (10^5) more READ COMPOUNDs run and the resident set size
is printed before and after (``rss_growth_kib``: it must stay flat: reply cache and pools are
bounded). Last line: ``read_us=… getattr_us=… openclose_us=… rss_kib=… rss_growth_kib=…
build=pure|compiled:N (N modules compiled: which selection of setup.py) move_watch=on|off meta_us=… meta_handoffs=… protected=0|1`` (whether the export's file system is watched for moves, so that PUTFH's
confinement check is saved across COMPOUNDs: vfs/confine.py; ``--no-move-watch`` turns it
off; ``--dir`` puts the temporary export elsewhere, e.g. on a file system of its own, where
other processes' renames do not end the watch's epochs).
``--back-channel`` runs every COMPOUND in a session made as the Linux client makes its own:
EXCHANGE_ID, CREATE_SESSION with CREATE_SESSION4_FLAG_CONN_BACK_CHAN, a callback program and
AUTH_SYS callback security, on the bench's one connection (which is then bound for both
channels), and a CB_NULL probe the server sends on that connection's back channel and the
bench's transport answers, as the client does. Without it, the session has no back channel
(the in-process driver's mount: no flags, no callback security), and is not bound to the
bench's connection until its first SEQUENCE binds it for the fore channel. The last line then
ends ``back_channel=0|1``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from attr_encode import linux_getattr_bitmap
from server_compound import Bench, _op, open_op

import nfsrdma
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.callback import Callbacks
from nfsrdma.nfs4.compound import compound
from nfsrdma.nfs4.inprocess import BACK_CHANNEL, FORE_CHANNEL, argop, resok
from nfsrdma.nfs4.server_state import ServerState
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import Dispatcher, null_procedure
from nfsrdma.session.records import BOTH
from nfsrdma.transport.tcp import LAST_FRAGMENT, TcpConnection
from nfsrdma.vfs import identity
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader

OK = nfs4.NFS4_OK
LINUX_BITMAP = linux_getattr_bitmap()
NO_CREATE = nfs4.openflag4(nfs4.OPEN4_NOCREATE, None)


CB_PROGRAM = 0x40000000  # the Linux client's callback program number
# The Linux client's callback security: AUTH_SYS, root, its host name.
CB_SEC = nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "bench-host", 0, 0, []))
_RPC_CALL = b"\x00\x00\x00\x00"
# A reply's header after its xid: REPLY, MSG_ACCEPTED, AUTH_NONE verifier, SUCCESS
_ACCEPTED = (1).to_bytes(4, "big") + bytes(16)


class MemoryTransport:
    """The asyncio transport side of an in-process connection: replies are counted and
    dropped (the last one is kept for checking). A call the server sends on the back channel
    (a CB_NULL probe) is answered, as the client would, through ``answer``."""

    def __init__(self) -> None:
        self.replies = 0
        self.last: list[bytes | bytearray | memoryview] = []
        self.answer: Callable[[bytes], None] | None = None
        self.calls = 0

    def writelines(self, pieces: list[bytes | bytearray | memoryview]) -> None:
        record = b"".join(bytes(p) for p in pieces) if len(pieces) > 1 else bytes(pieces[0])
        if record[8:12] == _RPC_CALL and self.answer is not None:  # the back channel
            self.calls += 1
            reply = record[4:8] + _ACCEPTED  # xid: CB_NULL's empty result
            asyncio.get_running_loop().call_soon(self.answer, marked(reply))
            return
        self.replies += 1
        self.last = pieces

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class Served:
    """One in-process client connection into the server's RPC layer."""

    def __init__(self, state: ServerState) -> None:
        def compound_proc(call, w):  # type: ignore[no-untyped-def]
            return compound(state, call, w)  # as NFSServer._compound does

        self.dispatcher = Dispatcher()
        self.dispatcher.add(
            nfs4.NFS4_PROGRAM,
            nfs4.NFS_V4,
            {nfs4.NFSPROC4_NULL: null_procedure, nfs4.NFSPROC4_COMPOUND: compound_proc},
        )
        self.transport = MemoryTransport()
        self.conn = TcpConnection("bench:1")
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.rpc = RpcConnection(self.conn, self.dispatcher)
        self.transport.answer = self.conn.data_received

    async def result(self, ops: list[nfs4.nfs_argop4], bench: Bench) -> nfs4.COMPOUND4res:
        """``ops`` sent on this connection (``bench``'s caller); the reply, which must be
        NFS4_OK."""
        await self.send(marked(bench.request(ops)))
        reply = b"".join(bytes(p) for p in self.transport.last)[4:]
        res, _ = nfs4.dec_COMPOUND4res(Reader(reply), 24)
        if res.status != OK:
            raise RuntimeError(f"set-up COMPOUND: {nfs4.nfsstat4(res.status).name}")
        return res

    async def linux_mount(self, bench: Bench) -> bytes:
        """A session as the Linux client makes it, on this connection (bound for both
        channels), its back channel probed with CB_NULL (answered by this connection's
        transport), RECLAIM_COMPLETE; ``bench`` then sends in it; the root's filehandle."""
        owner4 = nfs4.client_owner4(b"boot0001", b"bench back channel")
        eia = nfs4.EXCHANGE_ID4args(owner4, 0, nfs4.state_protect4_a(nfs4.SP4_NONE), [])
        eir = resok(await self.result([argop(nfs4.OP_EXCHANGE_ID, eia)], bench), 0)
        csa = nfs4.CREATE_SESSION4args(
            eir.eir_clientid,
            eir.eir_sequenceid,
            nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
            FORE_CHANNEL,
            BACK_CHANNEL,
            CB_PROGRAM,
            [CB_SEC],
        )
        csr = resok(await self.result([argop(nfs4.OP_CREATE_SESSION, csa)], bench), 0)
        bench.sessionid, bench.seqid = csr.csr_sessionid, 0
        if not await Callbacks(bench.server.sessions).probe(eir.eir_clientid):
            raise RuntimeError("CB_NULL on the back channel got no answer")
        if self.transport.calls != 1:
            raise RuntimeError(f"{self.transport.calls} back-channel calls, not 1")
        reclaim = argop(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))
        await self.result([bench.sequence(), reclaim], bench)
        ops = [bench.sequence(), argop(nfs4.OP_PUTROOTFH), argop(nfs4.OP_GETFH)]
        root = await self.result(ops, bench)
        fh: bytes = resok(root, 2).object
        return fh

    async def send(self, record: bytes) -> None:
        before = self.transport.replies
        self.conn.data_received(record)
        while self.transport.replies == before:  # a handler that waited (thread pool)
            await asyncio.sleep(0)

    def last_status(self) -> int:
        reply = b"".join(bytes(p) for p in self.transport.last)[4:]
        # xid, REPLY, MSG_ACCEPTED, verifier (flavor, empty body), SUCCESS: then COMPOUND4res
        return int.from_bytes(reply[24:28], "big")


class MetaFiles:
    """The meta shape: one file created, closed, looked up and removed, in the four COMPOUNDs
    the Linux client sends for nfsbench.py's meta phase. The CLOSE needs the OPEN's stateid and
    the file's handle, so requests are encoded as they go; ``send`` (the caller's: it times or
    profiles) is given each request alone."""

    ACCESS_ALL = (
        nfs4.ACCESS4_READ
        | nfs4.ACCESS4_LOOKUP
        | nfs4.ACCESS4_MODIFY
        | nfs4.ACCESS4_EXTEND
        | nfs4.ACCESS4_DELETE
        | nfs4.ACCESS4_EXECUTE
    )

    def __init__(self, bench: Bench, served: Served, dir_fh: bytes) -> None:
        self.bench, self.served, self.dir_fh = bench, served, dir_fh
        self.owner = nfs4.open_owner4(1, b"meta")
        self.mode = nfs4.fattr4(bitmap_of([nfs4.FATTR4_MODE]), (0o644).to_bytes(4, "big"))
        self.verifier = 0

    def _rec(self, ops: list[nfs4.nfs_argop4]) -> bytes:
        return marked(self.bench.request([self.bench.sequence(), *ops]))

    def open(self, name: bytes) -> bytes:
        self.verifier += 1
        how = nfs4.createhow4(
            nfs4.EXCLUSIVE4_1, nfs4.creatverfattr(self.verifier.to_bytes(8, "big"), self.mode)
        )
        create = nfs4.openflag4(nfs4.OPEN4_CREATE, how)
        return self._rec(
            [
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(self.dir_fh)),
                open_op(name, self.owner, nfs4.OPEN4_SHARE_ACCESS_WRITE, create),
                _op(nfs4.OP_GETFH),
                _op(nfs4.OP_ACCESS, nfs4.ACCESS4args(self.ACCESS_ALL)),
                _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
            ]
        )

    def close(self, fh: bytes, sid: nfs4.stateid4) -> bytes:
        return self._rec(
            [
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                _op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid)),
                _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
            ]
        )

    def lookup(self, name: bytes) -> bytes:
        return self._rec(
            [
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(self.dir_fh)),
                _op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
                _op(nfs4.OP_GETFH),
                _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
            ]
        )

    def remove(self, name: bytes) -> bytes:
        return self._rec(
            [
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(self.dir_fh)),
                _op(nfs4.OP_REMOVE, nfs4.REMOVE4args(name)),
            ]
        )

    async def one_file(self, name: bytes, send: Callable[[bytes, str], Awaitable[int]]) -> int:
        """The four COMPOUNDs for ``name``; the sum of what ``send`` returned. Every reply must
        be NFS4_OK."""
        total = await self._checked(send, self.open(name), "OPEN")
        reply = b"".join(bytes(p) for p in self.served.transport.last)[4:]
        res, _ = nfs4.dec_COMPOUND4res(Reader(reply), 24)
        sid = res.resarray[2].value.value.stateid
        fh = res.resarray[3].value.value.object
        total += await self._checked(send, self.close(fh, sid), "CLOSE")
        total += await self._checked(send, self.lookup(name), "LOOKUP")
        total += await self._checked(send, self.remove(name), "REMOVE")
        return total

    async def _checked(
        self, send: Callable[[bytes, str], Awaitable[int]], request: bytes, what: str
    ) -> int:
        spent = await send(request, what)
        status = self.served.last_status()
        if status != OK:
            raise RuntimeError(f"meta {what}: {nfs4.nfsstat4(status).name}")
        return spent


def marked(data: bytes) -> bytes:
    return (LAST_FRAGMENT | len(data)).to_bytes(4, "big") + data


async def per_compound(
    served: Served, requests: list[bytes], compounds_per_request: float = 1.0
) -> float:
    t0 = time.process_time_ns()
    for rec in requests:
        await served.send(rec)
    return (time.process_time_ns() - t0) / len(requests) / compounds_per_request / 1000


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=5000, help="COMPOUNDs per measure")
    ap.add_argument("--repeat", type=int, default=7, help="measures; the median is kept")
    ap.add_argument("--rss-count", type=int, default=100_000, help="COMPOUNDs for the RSS check")
    ap.add_argument(
        "--no-move-watch",
        action="store_true",
        help="check every descriptor in every COMPOUND (vfs/confine.py MoveWatch off)",
    )
    ap.add_argument("--dir", default=None, help="where the temporary export is made")
    ap.add_argument(
        "--shapes",
        default="read,getattr,openclose,meta",
        help="the shapes to measure, comma-separated (to profile one alone)",
    )
    ap.add_argument(
        "--protect",
        action="store_true",
        help="protect the loop thread as the server does (the identity worker runs calls for "
        "other identities)",
    )
    ap.add_argument(
        "--caller",
        default="0:0:",
        help="the AUTH_SYS credential, UID:GID:GID,GID,... (default 0:0: root, no groups)",
    )
    ap.add_argument("--root-squash", action="store_true", help="the export squashes root")
    ap.add_argument(
        "--back-channel",
        action="store_true",
        help="a session with a back channel on the bench's connection, as the Linux client's",
    )
    return asyncio.run(measure(ap.parse_args()))


async def measure(args: argparse.Namespace) -> int:
    uid, gid, groups = args.caller.split(":")
    cred = auth_sys(int(uid), int(gid), [int(g) for g in groups.split(",") if g], "bench-host")
    if args.protect:
        identity.protect_current_thread()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        os.chmod(tmp, 0o755)
        bench = Bench(
            Path(tmp),
            watch_moves=not args.no_move_watch,
            cred=cred,
            root_squash=args.root_squash,
        )
        (Path(tmp) / "export").chmod(0o777)  # any caller may create there
        (Path(tmp) / "export" / "meta").mkdir()  # the meta shape's directory, as nfsbench.py's
        (Path(tmp) / "export" / "meta").chmod(0o777)
        try:
            return await _measure(bench, args)
        finally:
            bench.vfs.release_identity()  # (unprotected, this thread acted as the callers)
            bench.server.close()


async def _measure(bench: Bench, args: argparse.Namespace) -> int:
    served = Served(bench.server)
    if args.back_channel:
        root_fh = await served.linux_mount(bench)
        # Every set-up COMPOUND on the same connection, as the Linux client's one.
        bench.result = functools.partial(served.result, bench=bench)  # type: ignore[method-assign]
    else:
        root_fh = await bench.mount()
    fh, stateid = await bench.create_file(root_fh, data=bytes(4096))

    def rec(ops: list[nfs4.nfs_argop4]) -> bytes:
        return marked(bench.request(ops))

    def read_req() -> bytes:
        return rec(
            [
                bench.sequence(),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                _op(nfs4.OP_READ, nfs4.READ4args(stateid, 0, 4096)),
            ]
        )

    def getattr_req() -> bytes:
        return rec(
            [
                bench.sequence(),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
            ]
        )

    # The pair opens the existing file with a second owner, then closes that open. Its stateid
    # seqid is 1 each time: a fresh open of an owner that has none.
    pair_owner = nfs4.open_owner4(1, b"pair")
    pair_sid = [nfs4.stateid4(0, b"")]

    def open_req() -> bytes:
        return rec(
            [
                bench.sequence(),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(root_fh)),
                open_op(b"file", pair_owner, nfs4.OPEN4_SHARE_ACCESS_READ, NO_CREATE),
                _op(nfs4.OP_GETFH),
            ]
        )

    # Learn the pair's stateid once (the "other" part stays the same for the owner's opens of
    # one file only while it is open, so each measure opens and closes through the wire).
    async def one_pair() -> None:
        await served.send(open_req())
        if served.last_status() != OK:
            raise RuntimeError(f"OPEN failed: {nfs4.nfsstat4(served.last_status()).name}")
        reply = b"".join(bytes(p) for p in served.transport.last)[4:]
        res, _ = nfs4.dec_COMPOUND4res(Reader(reply), 24)
        pair_sid[0] = res.resarray[2].value.value.stateid
        await served.send(close_req())
        if served.last_status() != OK:
            raise RuntimeError(f"CLOSE failed: {nfs4.nfsstat4(served.last_status()).name}")

    def close_req() -> bytes:
        return rec(
            [
                bench.sequence(),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                _op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, pair_sid[0])),
            ]
        )

    for make in (read_req, getattr_req):
        await served.send(make())
        if served.last_status() != OK:
            raise RuntimeError(f"{make.__name__}: {nfs4.nfsstat4(served.last_status()).name}")
    if args.back_channel:
        session = bench.server.sessions.session(bench.sessionid)
        assert session is not None
        if session.connections != {served.rpc: BOTH} or not session.back_path_up:
            raise RuntimeError("the back channel is not bound as the Linux client's")
        reply = b"".join(bytes(p) for p in served.transport.last)[4:]
        flags = resok(nfs4.dec_COMPOUND4res(Reader(reply), 24)[0], 0).sr_status_flags
        if flags:
            raise RuntimeError(f"SEQUENCE's status flags {flags:#x} with the back channel up")
    await one_pair()

    async def pairs_per_compound(n: int) -> float:
        # The CLOSE needs the stateid the OPEN returned: requests are encoded as they go (the
        # encoding is on the client side, so its time is taken out).
        total = 0
        for _ in range(n):
            o = open_req()
            t0 = time.process_time_ns()
            await served.send(o)
            total += time.process_time_ns() - t0
            reply = b"".join(bytes(p) for p in served.transport.last)[4:]
            res, _ = nfs4.dec_COMPOUND4res(Reader(reply), 24)
            pair_sid[0] = res.resarray[2].value.value.stateid
            c = close_req()
            t0 = time.process_time_ns()
            await served.send(c)
            total += time.process_time_ns() - t0
        if served.last_status() != OK:
            raise RuntimeError("CLOSE failed")
        return total / n / 2 / 1000

    figures: dict[str, float] = {}
    shapes = set(args.shapes.split(","))
    for key, make in (("read_us", read_req), ("getattr_us", getattr_req)):
        if key[:-3] not in shapes:
            continue
        runs = []
        for _ in range(args.repeat):
            requests = [make() for _ in range(args.count)]
            runs.append(await per_compound(served, requests))
        if served.last_status() != OK:
            raise RuntimeError(f"{key}: {nfs4.nfsstat4(served.last_status()).name}")
        figures[key] = statistics.median(runs)
        print(f"{key:>14}: {figures[key]:7.2f} us CPU per COMPOUND (runs {_fmt(runs)})")
    if "openclose" in shapes:
        runs = [await pairs_per_compound(max(1, args.count // 4)) for _ in range(args.repeat)]
        figures["openclose_us"] = statistics.median(runs)
        print(
            f"{'openclose_us':>14}: {figures['openclose_us']:7.2f} us CPU per COMPOUND"
            f" (runs {_fmt(runs)})"
        )

    looked_up = await bench.result(
        [
            bench.sequence(),
            _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(root_fh)),
            _op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"meta")),
            _op(nfs4.OP_GETFH),
        ]
    )
    meta = MetaFiles(bench, served, looked_up.resarray[3].value.value.object)
    kinds: dict[str, int] = {}

    async def timed(request: bytes, what: str) -> int:
        t0 = time.process_time_ns()
        await served.send(request)
        spent = time.process_time_ns() - t0
        kinds[what] = kinds.get(what, 0) + spent
        return spent

    # (an older nfsrdma has no hand-off count: the bench can measure it too, as nan)
    count_handoffs = getattr(identity, "handoffs", lambda: float("nan"))

    async def meta_per_compound(n: int) -> tuple[float, float]:
        total = 0
        handed = count_handoffs()
        for i in range(n):
            total += await meta.one_file(b"m%d" % i, timed)
        return total / n / 4 / 1000, (count_handoffs() - handed) / n / 4

    tail: dict[str, float] = {}
    if "meta" in shapes:
        await meta_per_compound(2)  # warm-up
        measured = [await meta_per_compound(max(1, args.count // 8)) for _ in range(args.repeat)]
        runs = [us for us, _ in measured]
        tail["meta_us"] = statistics.median(runs)
        tail["meta_handoffs"] = measured[-1][1]
        rounds = 2 + args.repeat * max(1, args.count // 8)
        print(
            f"{'':>14}  by COMPOUND: "
            + ", ".join(f"{k} {v / rounds / 1000:.1f}" for k, v in kinds.items())
        )
        print(
            f"{'meta_us':>14}: {tail['meta_us']:7.2f} us CPU per COMPOUND"
            f" (runs {_fmt(runs)}), {tail['meta_handoffs']:.2f} identity hand-offs per COMPOUND"
        )

    # Memory: 10^5 more COMPOUNDs, in batches (requests are built batch by batch).
    batch = 5000
    done = 0
    start = rss_kib()
    while done < args.rss_count:
        n = min(batch, args.rss_count - done)
        requests = [read_req() for _ in range(n)]
        for r in requests:
            await served.send(r)
        done += n
        if done == min(args.rss_count, 2 * batch):
            start = rss_kib()  # after warm-up: the slot's cached reply, pools and caches made
    end = rss_kib()
    if served.last_status() != OK:
        raise RuntimeError("READ failed during the RSS run")
    print(f"RSS after {args.rss_count} COMPOUNDs: {end} KiB (after warm-up {start} KiB)")
    compiled = nfsrdma.compiled_modules()  # (how many: which selection, setup.py)
    build = f"compiled:{len(compiled)}" if compiled else "pure"
    watched = "on" if bench.vfs._res.watched else "off"
    print(
        " ".join(f"{k}={v:.2f}" for k, v in figures.items())
        + f" rss_kib={end} rss_growth_kib={end - start} build={build} move_watch={watched}"
        + "".join(f" {k}={v:.2f}" for k, v in tail.items())
        + f" protected={int(args.protect)} back_channel={int(args.back_channel)}"
    )
    return 0


def _fmt(runs: list[float]) -> str:
    return " ".join(f"{r:.1f}" for r in runs)


if __name__ == "__main__":
    sys.exit(main())
