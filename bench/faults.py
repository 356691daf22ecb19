"""Connection kills during WRITE, RENAME, CREATE and LOCK between our client and our server,
checked against a model (issue 9, "Reliability figures").

TCP (the default): our server runs in this process on 127.0.0.1, our client
(``nfsrdma.connect``) reaches it through a kill proxy (``killproxy.py``) that aborts the
connection at a random point of the chosen operation: before the call reaches the server,
part-way through its record, after the server executed it (the reply is lost), or racing the
execution. RDMA (``--transport rdma``, in the test bed): the server listens on RDMA as well and
the client's own connection is aborted at a random moment while the operation is in flight.

Each operation is checked right after it returns, through a second client that is never
killed, and the whole at the end:

- WRITE: overlapping writes of random blocks into one file; at the end the file must equal the
  model byte for byte (``lost_bytes``: model bytes missing or different; ``dup_bytes``: bytes
  beyond the model's end);
- RENAME: one file walks through a chain of names; the directory must hold exactly the new name;
- CREATE: mkdir (CREATE) or an exclusive create (OPEN, GUARDED4), then CLOSE; the directory must
  hold exactly the names made;
- LOCK: a byte-range lock then its unlock; while held the second client must be refused the
  range, after the unlock it must get it.

An operation that fails, or whose check fails, is not "exactly once". After the clients close,
the server's own state objects are counted: ``leaked_state`` = stateids + sessions + client
records + connections still open. With ``--server-url`` (a server elsewhere) that cannot be
counted and is reported as ``n/a``.

Last line: ``kills=… ops=… exactly_once=… lost_bytes=… dup_bytes=… leaked_state=…``. With
``--check`` the exit status is 1 when a target is missed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from killproxy import MODES, KillProxy
from reliability import step

import nfsrdma
from nfsrdma.client import NfsClient, NfsFile, parse_url
from nfsrdma.server import NFSServer
from nfsrdma.xdr.gen import nfs4

FILE_SIZE = 2 << 20
KINDS = ("write", "rename", "create", "lock")
TARGETS = {
    "write": {nfs4.OP_WRITE},
    "rename": {nfs4.OP_RENAME},
    "create": {nfs4.OP_CREATE, nfs4.OP_OPEN},
    "lock": {nfs4.OP_LOCK, nfs4.OP_LOCKU},
}


@dataclass
class Tally:
    kills: int = 0
    ops: int = 0
    exactly_once: int = 0
    failures: list[str] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    by_mode: dict[str, int] = field(default_factory=dict)


class Model:
    def __init__(self) -> None:
        self.data = bytearray()
        self.rename_at = 0
        self.created: set[str] = set()


class Campaign:
    def __init__(
        self,
        fs: NfsClient,
        probe: NfsClient,
        killer: Killer,
        rng: random.Random,
        tally: Tally,
        op_timeout: float,
    ) -> None:
        self.fs = fs
        self.probe = probe
        self.killer = killer
        self.rng = rng
        self.tally = tally
        self.op_timeout = op_timeout
        self.model = Model()
        self.wf: NfsFile | None = None
        self.lf: NfsFile | None = None
        self.pf: NfsFile | None = None
        self.seq = 0
        self.base = ""

    async def setup(self) -> None:
        # Everything under a directory of this run's own (a server elsewhere may have others).
        self.base = f"faults-{os.getpid()}-{time.time_ns()}"
        await self.fs.mkdir(self.base)
        for d in ("r", "c"):
            await self.fs.mkdir(self.p(d))
        await self.fs.write_bytes(self.p("r/n0"), b"walker")
        await self.fs.write_bytes(self.p("l.bin"), bytes(4096))
        self.wf = await self.fs.open(self.p("w.bin"), "w+b")
        self.lf = await self.fs.open(self.p("l.bin"), "r+b")
        self.pf = await self.probe.open(self.p("l.bin"), "r+b")

    def p(self, path: str) -> str:
        return f"{self.base}/{path}"

    async def teardown(self) -> None:
        for f in (self.wf, self.lf, self.pf):
            if f is not None:
                with contextlib.suppress(OSError):
                    await f.close()

    async def one(self, kind: str, mode: str) -> None:
        """One operation of ``kind`` with a kill armed; checked against the model."""
        self.tally.ops += 1
        self.seq += 1
        try:
            ok = await asyncio.wait_for(self._run(kind, mode), self.op_timeout)
        except Exception as e:
            ok = False
            self.tally.failures.append(f"{kind}/{mode} #{self.seq}: {type(e).__name__}: {e}")
        finally:
            self.killer.disarm()
        if ok:
            self.tally.exactly_once += 1

    async def _run(self, kind: str, mode: str) -> bool:
        if kind == "write":
            return await self._write(mode)
        if kind == "rename":
            return await self._rename(mode)
        if kind == "create":
            return await self._create(mode)
        return await self._lock(mode)

    async def _killed(self, kind: str, mode: str, op: Awaitable[Any]) -> Any:
        fired = await self.killer.arm(TARGETS[kind], mode)
        result = await op
        if fired():
            self.tally.kills += 1
            self.tally.by_kind[kind] = self.tally.by_kind.get(kind, 0) + 1
            self.tally.by_mode[mode] = self.tally.by_mode.get(mode, 0) + 1
        return result

    async def _write(self, mode: str) -> bool:
        assert self.wf is not None
        size = self.rng.choice([1, 4096, 65536, 200_000, 600_000])
        off = self.rng.randrange(0, FILE_SIZE - size)
        block = self.rng.randbytes(size)
        await self._killed("write", mode, self.wf.pwrite(memoryview(block), off))
        m = self.model.data
        if len(m) < off + size:
            m.extend(bytes(off + size - len(m)))
        m[off : off + size] = block
        return True  # checked at the end, byte for byte

    async def _rename(self, mode: str) -> bool:
        old = self.p(f"r/n{self.model.rename_at}")
        new = self.p(f"r/n{self.model.rename_at + 1}")
        await self._killed("rename", mode, self.fs.rename(old, new))
        self.model.rename_at += 1
        names = await self.probe.listdir(self.p("r"))
        if names != [new.rsplit("/", 1)[1]]:
            self.tally.failures.append(f"rename #{self.seq} ({mode}): r/ holds {names}")
            return False
        return True

    async def _create(self, mode: str) -> bool:
        if self.seq % 2:
            name = f"d{self.seq}"
            await self._killed("create", mode, self.fs.mkdir(self.p(f"c/{name}")))
        else:
            name = f"f{self.seq}"
            f = await self._killed("create", mode, self.fs.open(self.p(f"c/{name}"), "xb"))
            await f.close()
        self.model.created.add(name)
        names = set(await self.probe.listdir(self.p("c")))
        if names != self.model.created:
            extra, missing = names - self.model.created, self.model.created - names
            self.tally.failures.append(f"create #{self.seq} ({mode}): +{extra} -{missing}")
            return False
        return True

    async def _lock(self, mode: str) -> bool:
        assert self.lf is not None and self.pf is not None
        off = (self.seq % 200) * 16
        unlock_first = self.rng.random() < 0.5
        if unlock_first:  # the kill strikes the LOCKU
            await self.lf.lock(off, 8)
            held = await self._probe_refused(off)
            await self._killed("lock", mode, self.lf.unlock(off, 8))
        else:
            await self._killed("lock", mode, self.lf.lock(off, 8))
            held = await self._probe_refused(off)
            await self.lf.unlock(off, 8)
        free = not await self._probe_refused(off)
        if not (held and free):
            self.tally.failures.append(f"lock #{self.seq} ({mode}): held={held} free={free}")
            return False
        return True

    async def _probe_refused(self, off: int) -> bool:
        """Whether the second client is refused the range (then it holds nothing)."""
        assert self.pf is not None
        try:
            await self.pf.lock(off, 8)
        except BlockingIOError:
            return True
        await self.pf.unlock(off, 8)
        return False

    async def check_write(self) -> tuple[int, int]:
        """(lost, duplicated) bytes of the written file against the model."""
        assert self.wf is not None
        await self.wf.fsync()
        got = await self.probe.read_bytes(self.p("w.bin"))
        m = bytes(self.model.data)
        common = min(len(got), len(m))
        lost = sum(1 for a, b in zip(got[:common], m[:common], strict=True) if a != b)
        lost += max(0, len(m) - len(got))
        dup = max(0, len(got) - len(m))
        return lost, dup


class Killer:
    """Arms a kill for the next call carrying one of the operations."""

    async def arm(self, ops: set[int], mode: str) -> Callable[[], bool]:
        raise NotImplementedError

    def disarm(self) -> None:
        pass


class ProxyKiller(Killer):
    def __init__(self, proxy: KillProxy) -> None:
        self.proxy = proxy

    async def arm(self, ops: set[int], mode: str) -> Callable[[], bool]:
        kill = self.proxy.arm(ops, mode)
        return kill.fired.is_set

    def disarm(self) -> None:
        self.proxy.disarm()


class ClientSideKiller(Killer):
    """RDMA (no proxy possible): abort the client's connection a random moment after a call
    of the operation went out, if it is still unanswered then (a kill)."""

    def __init__(self, fs: NfsClient, rng: random.Random, window: float) -> None:
        self.fs = fs
        self.rng = rng
        self.window = window
        self.task: asyncio.Task[None] | None = None

    async def arm(self, ops: set[int], mode: str) -> Callable[[], bool]:
        state = {"fired": False}

        async def strike() -> None:
            # Wait for a call in flight, then abort the connection a random moment later
            # if the call is still unanswered.
            for _ in range(10000):
                rpc = self.fs.session.rpc
                if rpc is not None and rpc.pending:
                    break
                await asyncio.sleep(0)
            else:
                return
            if self.rng.random() < 0.5:  # at once (the call is on its way), or a bit later
                await asyncio.sleep(self.rng.random() * self.window)
            if rpc.pending and not rpc.conn.closed:
                rpc.conn.close()
                state["fired"] = True

        self.task = asyncio.ensure_future(strike())
        return lambda: state["fired"]

    def disarm(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None


def leaked(server: NFSServer) -> dict[str, int]:
    assert server.state is not None
    s = server.state
    return {
        "stateids": s.state_manager.stateid_count,
        "sessions": len(s.sessions.sessions),
        "clients": len(s.sessions.clients.by_id),
        "connections": len(server.connections),
    }


async def settle(server: NFSServer, bound: float = 10.0) -> dict[str, int]:
    """The server's state once the closing connections have been noticed (bounded)."""
    deadline = time.monotonic() + bound
    counts = leaked(server)
    while sum(counts.values()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        counts = leaked(server)
    return counts


async def campaign(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    tally = Tally()
    scratch = Path(tempfile.mkdtemp(prefix="faults-"))
    export = scratch / "export"
    export.mkdir()
    server: NFSServer | None = None
    proxy: KillProxy | None = None
    if args.server_url:
        url = direct = args.server_url
        target = parse_url(direct)
        if target.scheme == "nfs" and args.killer == "proxy":  # the proxy in front of it
            proxy = await KillProxy(target.host, target.port, args.seed).start()
            url = f"nfs://127.0.0.1:{proxy.port}{target.path}"
    else:
        rdma = args.transport == "rdma"
        server = NFSServer(
            str(export),
            bind=args.bind,
            tcp_port=0,
            rdma_port=args.rdma_port if rdma else None,
            rdma_device=args.rdma_device,
            root_squash=False,
            state_dir=str(scratch),
            lease_time=args.lease_time,
        )
        await server.start()
        if rdma:
            assert server.rdma is not None, "no RDMA listener (no device?)"
            url = direct = f"rdma://{args.bind}:{server.rdma.port}/"
        else:
            direct = f"nfs://{args.bind}:{server.tcp_port}/"
            proxy = await KillProxy(args.bind, server.tcp_port, args.seed).start()
            url = f"nfs://{args.bind}:{proxy.port}/"
    step(f"client through {url}; second client on {direct}")
    t0 = time.perf_counter()
    lost = dup = 0
    counts: dict[str, int] | None = None
    try:
        fs = await nfsrdma.connect(url, uid=0, gid=0, timeout=args.client_timeout)
        probe = await nfsrdma.connect(direct, uid=0, gid=0, timeout=args.client_timeout)
        killer: Killer = (
            ProxyKiller(proxy)
            if proxy is not None and args.killer == "proxy"
            else ClientSideKiller(fs, rng, args.kill_window)
        )
        run = Campaign(fs, probe, killer, rng, tally, args.op_timeout)
        try:
            await run.setup()
            i = 0
            while tally.kills < args.kills and i < args.kills * 3:
                kind = KINDS[i % len(KINDS)]
                mode = rng.choice(MODES) if isinstance(killer, ProxyKiller) else "client-abort"
                await run.one(kind, mode)
                i += 1
                if i % 20 == 0:
                    step(f"{i} operations, {tally.kills} kills, {len(tally.failures)} failures")
            lost, dup = await run.check_write()
        finally:
            await run.teardown()
            await fs.aclose()
            await probe.aclose()
        if server is not None:
            counts = await settle(server)
    finally:
        if proxy is not None:
            await proxy.close()
        if server is not None:
            await server.close()
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    for f in tally.failures[:10]:
        print(f"FAILED {f}")
    print(f"{tally.ops} operations in {elapsed:.1f} s; kills by operation {tally.by_kind}, "
          f"by point {tally.by_mode}; proxy connections {proxy.connections if proxy else 'n/a'}")  # fmt: skip
    print(f"server state after the clients closed: {counts if counts is not None else 'n/a'}")
    leaked_state = "n/a" if counts is None else str(sum(counts.values()))
    print(
        f"kills={tally.kills} ops={tally.ops} exactly_once={tally.exactly_once} "
        f"lost_bytes={lost} dup_bytes={dup} leaked_state={leaked_state}"
    )
    good = tally.exactly_once == tally.ops and not lost and not dup and leaked_state in ("0", "n/a")
    missed = not (good and tally.kills >= args.kills)
    return 1 if missed and args.check else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--transport", choices=("tcp", "rdma"), default="tcp")
    ap.add_argument(
        "--server-url",
        default=None,
        help="a server already running (nfs:// through the kill proxy, rdma:// with the client "
        "killer); its state cannot be counted from here: leaked_state=n/a",
    )
    ap.add_argument("--bind", default="127.0.0.1", help="our server's address (RDMA: the rxe one)")
    ap.add_argument("--rdma-port", type=int, default=20050)
    ap.add_argument("--rdma-device", default=None)
    ap.add_argument(
        "--killer",
        choices=("proxy", "client"),
        default="proxy",
        help="TCP: kill in the proxy, or abort the client's connection (as RDMA does)",
    )
    ap.add_argument("--kill-window", type=float, default=0.002, help="client killer: within s")
    ap.add_argument("--lease-time", type=int, default=30)
    ap.add_argument("--client-timeout", type=float, default=5.0, help="client probe timeout")
    ap.add_argument("--op-timeout", type=float, default=60.0)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    logging.basicConfig(
        level=logging.WARNING if os.environ.get("FAULTS_VERBOSE") else logging.ERROR
    )
    return asyncio.run(campaign(args))


if __name__ == "__main__":
    sys.exit(main())
