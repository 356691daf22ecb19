"""Abuse: the four holes of issue 9 and slow-loris, replayed against our server while an
honest client measures its latency (issue 9, "Reliability figures").

The server is ``python -m nfsrdma serve`` in its own process on 127.0.0.1, with small limits so
the run takes a minute or two: ``--max-connections``, ``--max-connections-per-source`` and
``--idle-timeout`` when the server knows them (a server without them is run without, and the
holes they close stay open), and a descriptor limit (``--server-nofile``). Attackers connect from
other loopback addresses (127.0.0.2 ...) so that per-source limits can tell them from the honest
client (127.0.0.1), which runs in its own process: one connected client doing stat + read of a
small file, and in every phase a newcomer that connects (a new client ID and session).

1. A directory moved out of the export, then used through its old handle: PUTFH + LOOKUP, READ,
   and CREATE through it must fail (NFS4ERR_STALE), nothing may appear outside.
2. Floods of empty (and 2-byte) non-final record-marking fragments: the server must close the
   connection, and its RSS stay bounded.
3. Thousands of idle connections and slow-loris connections (a byte a second): connections
   over the limits refused, idle ones closed after the idle timeout, logging bounded, the honest
   client unaffected.
4. (a) One connection spinning EXCHANGE_ID; (b) four client IDs x 16 sessions asking for large
   cached replies, leases renewed: the honest newcomer gets a session without delay.

Last line: ``honest_p99_ratio=… honest_failures=… holes_open=…`` (targets: <= 5, 0, 0). With
``--check`` the exit status is 1 when a target is missed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from reliability import ServerProcess, open_fds, percentile, rss_kib, step

import nfsrdma
from nfsrdma.client import ops
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.transport.tcp import LAST_FRAGMENT, TcpConnection
from nfsrdma.xdr.gen import nfs4

U32 = struct.Struct(">I")
HONEST_FILE = "honest.txt"
ATTACK_SOURCES = [f"127.0.0.{i}" for i in range(2, 10)]
LORIS_SOURCE = "127.0.0.10"


# -- the honest client (its own process) ------------------------------------------------------


async def honest_main(url: str) -> None:
    """Read commands on stdin (``PHASE name seconds`` / ``QUIT``), answer one JSON line each."""
    logging.basicConfig(level=logging.CRITICAL)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    fs = await asyncio.wait_for(nfsrdma.connect(url, uid=0, gid=0), 30)
    await fs.write_bytes(HONEST_FILE, b"honest data\n")
    print(json.dumps({"ready": True}), flush=True)
    while line := (await reader.readline()).decode().split():
        if line[0] == "QUIT":
            break
        name, seconds = line[1], float(line[2])
        lat: list[float] = []
        connect: list[float] = []
        slots: list[int] = []
        errors: list[str] = []
        end = time.perf_counter() + seconds
        newcomer_next = time.perf_counter()
        while time.perf_counter() < end:
            t = time.perf_counter()
            try:
                await asyncio.wait_for(_honest_op(fs), 10)
                lat.append(time.perf_counter() - t)
            except Exception as e:
                errors.append(f"op: {type(e).__name__}: {e}")
                await asyncio.sleep(0.2)
            if time.perf_counter() >= newcomer_next:
                newcomer_next = time.perf_counter() + max(1.0, seconds / 4)
                t = time.perf_counter()
                try:
                    async with asyncio.timeout(15):
                        async with nfsrdma.connect(url, uid=0, gid=0) as nc:
                            await nc.stat(HONEST_FILE)
                            slots.append(nc.session.negotiated.slots)
                    connect.append(time.perf_counter() - t)
                except Exception as e:
                    errors.append(f"newcomer: {type(e).__name__}: {e}")
            await asyncio.sleep(0.01)
        print(
            json.dumps(
                {"name": name, "lat": lat, "connect": connect, "slots": slots, "errors": errors}
            ),
            flush=True,
        )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(fs.aclose(), 10)


async def _honest_op(fs: Any) -> None:
    await fs.stat(HONEST_FILE)
    if await fs.read_bytes(HONEST_FILE) != b"honest data\n":
        raise AssertionError("honest file content changed")


class Honest:
    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--honest", self.url,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )  # fmt: skip
        await self._answer(60)

    async def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError("the honest client died")
        return dict(json.loads(line))

    async def measure(self, name: str, seconds: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"PHASE {name.replace(' ', '_')} {seconds}\n".encode())
        return await self._answer(seconds + 120)

    async def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"QUIT\n")
            await asyncio.wait_for(self.proc.wait(), 15)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


# -- attack tools ---------------------------------------------------------------------------------


def raw_socket(src: str, port: int, timeout: float = 5.0) -> socket.socket | None:
    s = socket.socket()
    try:
        s.settimeout(timeout)
        s.bind((src, 0))
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None


async def connect_from(src: str, port: int, timeout: float) -> socket.socket | None:
    """A non-blocking connection from ``src``, or None if it is not made within ``timeout``."""
    s = socket.socket()
    try:
        s.bind((src, 0))
        s.setblocking(False)
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port)), timeout
        )
        return s
    except (OSError, TimeoutError):
        s.close()
        return None


def closed_by_peer(s: socket.socket) -> bool:
    try:
        data = s.recv(65536)
        return data == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


async def rpc_from(src: str, port: int) -> RpcConnection:
    """An RPC connection (our own RPC layer) from source address ``src``."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.bind((src, 0))
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    _, proto = await loop.create_connection(lambda: TcpConnection(f"{src}->server"), sock=sock)
    return RpcConnection(proto)


CRED = auth_sys(uid=0, gid=0, machinename="abuse")


async def compound(
    rpc: RpcConnection, argops: list[nfs4.nfs_argop4], timeout: float = 10.0
) -> nfs4.COMPOUND4res:
    args = nfs4.COMPOUND4args(b"", 1, argops)
    res = await rpc.call(
        nfs4.NFS4_PROGRAM,
        nfs4.NFS_V4,
        nfs4.NFSPROC4_COMPOUND,
        lambda w: nfs4.enc_COMPOUND4args(w, args),
        cred=CRED,
        timeout=timeout,
    )
    out, _ = nfs4.dec_COMPOUND4res(res.reader, res.offset)
    return out


def exchange_id(owner: bytes) -> nfs4.nfs_argop4:
    a = nfs4.EXCHANGE_ID4args(
        nfs4.client_owner4(b"abusevrf", owner), 0, nfs4.state_protect4_a(nfs4.SP4_NONE), []
    )
    return nfs4.nfs_argop4(nfs4.OP_EXCHANGE_ID, a)


def create_session(clientid: int, seq: int, cached: int) -> nfs4.nfs_argop4:
    fore = nfs4.channel_attrs4(0, 1 << 20, 1 << 20, cached, 16, 64, [])
    back = nfs4.channel_attrs4(0, 4096, 4096, 4096, 4, 1, [])
    a = nfs4.CREATE_SESSION4args(
        clientid, seq, 0, fore, back, 0x40000000, [nfs4.callback_sec_parms4(nfs4.AUTH_NONE)]
    )
    return nfs4.nfs_argop4(nfs4.OP_CREATE_SESSION, a)


def sequence(sessionid: bytes, seqid: int) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(sessionid, seqid, 0, 0, False))


# -- the campaign ---------------------------------------------------------------------------------


@dataclass
class Hole:
    name: str
    open: bool
    detail: str


@dataclass
class Run:
    args: argparse.Namespace
    server: ServerProcess
    export: Path
    outside: Path
    honest: Honest
    holes: list[Hole] = field(default_factory=list)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def hole(self, name: str, is_open: bool, detail: str) -> None:
        self.holes.append(Hole(name, is_open, detail))
        step(f"{name}: {'OPEN' if is_open else 'closed'} ({detail})")

    async def under(self, name: str, attack: Callable[[float], Any]) -> Any:
        """Run ``attack(seconds)`` while the honest client measures for as long."""
        seconds = self.args.phase
        measuring = asyncio.ensure_future(self.honest.measure(name, seconds))
        try:
            result = await attack(seconds)
        finally:
            self.phases[name] = await measuring
        return result

    # 1 ------------------------------------------------------------------------------------------
    async def moved_directory(self) -> None:
        os.makedirs(self.export / "escape", exist_ok=True)
        (self.export / "escape" / "inside.txt").write_bytes(b"inside")
        rpc = await rpc_from("127.0.0.2", self.server.port)
        findings: list[str] = []
        try:
            session = await _session(rpc, b"abuse-mover", 1024)
            res = await compound(
                rpc,
                [sequence(session, 1), ops.putrootfh(), ops.lookup(b"escape"), ops.getfh()],
            )
            dir_fh = res.resarray[-1].value.value.object
            res = await compound(
                rpc,
                [sequence(session, 2), ops.putfh(dir_fh), ops.lookup(b"inside.txt"), ops.getfh()],
            )
            file_fh = res.resarray[-1].value.value.object
            os.rename(self.export / "escape", self.outside / "escape")
            (self.outside / "escape" / "secret.txt").write_bytes(b"outside the export")
            anon = nfs4.stateid4(0, bytes(12))
            attempts = {
                "LOOKUP": [ops.putfh(dir_fh), ops.lookup(b"secret.txt"), ops.getfh()],
                "READ": [ops.putfh(dir_fh), ops.lookup(b"secret.txt"), ops.read(anon, 0, 100)],
                "READ-old-file": [ops.putfh(file_fh), ops.read(anon, 0, 100)],
                "CREATE": [ops.putfh(dir_fh), ops.create(nfs4.NF4DIR, b"planted", {})],
            }
            for i, (what, argops) in enumerate(attempts.items()):
                res = await compound(rpc, [sequence(session, 3 + i), *argops])
                if res.status == nfs4.NFS4_OK:
                    findings.append(f"{what} succeeded")
                elif res.status != nfs4.NFS4ERR_STALE:
                    findings.append(f"{what}: {nfs4.nfsstat4(res.status).name}, not STALE")
            if (self.outside / "escape" / "planted").exists():
                findings.append("a directory was planted outside the export")
        finally:
            rpc.close()
        self.hole("1 moved directory", any("succeeded" in f or "planted" in f for f in findings),
                  "; ".join(findings) or "every use of the old handles: NFS4ERR_STALE")  # fmt: skip

    # 2 ------------------------------------------------------------------------------------------
    async def fragment_flood(self, seconds: float) -> None:
        pid = self.server.pid
        before = rss_kib(pid)
        loop = asyncio.get_running_loop()
        budget = self.args.flood_mib << 20
        results: list[tuple[int, bool]] = []

        async def flood(src: str, piece: bytes) -> None:
            s = raw_socket(src, self.server.port)
            if s is None:
                results.append((0, True))
                return
            chunk = piece * ((1 << 16) // len(piece))
            sent = 0
            closed = False
            deadline = time.monotonic() + seconds
            try:
                while sent < budget and time.monotonic() < deadline:
                    try:
                        await asyncio.wait_for(loop.sock_sendall(s, chunk), 5)
                    except TimeoutError:
                        break  # the server stopped reading: it is not taking more
                    sent += len(chunk)
                    if closed_by_peer(s):
                        closed = True
                        break
            except OSError:
                closed = True
            finally:
                s.close()
            results.append((sent, closed))

        empty = U32.pack(0)  # a zero-length fragment, not the last
        two = U32.pack(2) + b"xx"  # 2-byte fragments, never the last
        await asyncio.gather(flood("127.0.0.2", empty), flood("127.0.0.3", two))
        await asyncio.sleep(1.0)  # let the server notice the closes and free what it holds
        after = rss_kib(pid)
        sent = sum(n for n, _ in results)
        all_closed = all(c for _, c in results)
        growth = (after - before) / 1024
        self.hole("2 fragment flood", not all_closed or growth > self.args.rss_bound_mib,
                  f"{sent >> 20} MiB of fragment marks sent; connections closed by the server: "
                  f"{sum(c for _, c in results)}/{len(results)}; server RSS {before // 1024} -> "
                  f"{after // 1024} MiB after the close")  # fmt: skip

    # 3 ------------------------------------------------------------------------------------------
    async def connection_flood(self, seconds: float) -> None:
        args = self.args
        pid = self.server.pid
        log_before = _log_lines(self.server)
        fds_before = open_fds(pid)
        # Slow-loris first (from their own address, within the per-source share), then the
        # idle flood from the other attack addresses.
        loris = [
            s
            for s in [
                await connect_from(LORIS_SOURCE, self.server.port, 1.0) for _ in range(args.loris)
            ]
            if s is not None
        ]
        idle: list[socket.socket] = []
        refused = 0
        t0 = time.monotonic()
        per_source = max(1, args.idle_connections // len(ATTACK_SOURCES))
        failed_in_row = 0
        for src in ATTACK_SOURCES:
            for _ in range(per_source):
                s = await connect_from(src, self.server.port, 1.0)
                if s is None:
                    refused += 1
                    failed_in_row += 1
                else:
                    idle.append(s)
                    failed_in_row = 0
                if failed_in_row >= 20 or time.monotonic() > t0 + seconds / 2:
                    break  # the server takes no more (its backlog is full): enough
        t_connected = time.monotonic()
        record = U32.pack(LAST_FRAGMENT | 200) + bytes(200)
        fds_peak = open_fds(pid)
        # Slow-loris keeps trickling (a byte a second) until the verdict: the phase, and then
        # (when the server has an idle timeout) twice the timeout after the last connection.
        timeout_passed = "--idle-timeout" in self.server.extra
        end = t0 + seconds
        if timeout_passed:
            end = max(end, t_connected + 2 * args.idle_timeout + 1)
        i = 0
        while time.monotonic() < end:
            for s in loris:
                with contextlib.suppress(OSError):
                    s.send(record[i % len(record) : i % len(record) + 1])
            i += 1
            await asyncio.sleep(1.0)
            fds_peak = max(fds_peak, open_fds(pid))
        still_idle = sum(1 for s in idle if not closed_by_peer(s))
        still_loris = sum(1 for s in loris if not closed_by_peer(s))
        for s in idle + loris:
            s.close()
        log_lines = _log_lines(self.server) - log_before
        limit = args.max_connections
        findings = []
        if still_idle + still_loris > limit:
            findings.append(f"{still_idle + still_loris} attack connections open > limit {limit}")
        if not timeout_passed:
            findings.append("the server has no idle timeout")
        if timeout_passed and still_idle:
            findings.append(
                f"{still_idle} idle connections outlived the {args.idle_timeout} s timeout"
            )
        if timeout_passed and still_loris:
            findings.append(f"{still_loris} slow-loris connections outlived the idle timeout")
        per_min = log_lines * 60 / max(1.0, time.monotonic() - t0)
        if per_min > args.log_lines_per_min:
            findings.append(f"{per_min:.0f} log lines a minute")
        self.hole("3 connection flood", bool(findings),
                  f"{len(idle)} idle + {len(loris)} slow-loris connected ({refused} refused at "
                  f"connect); open at the end: {still_idle} idle, {still_loris} slow-loris; "
                  f"server fds {fds_before} -> peak {fds_peak}; {log_lines} log lines"
                  + ("; " + "; ".join(findings) if findings else ""))  # fmt: skip

    # 4a -----------------------------------------------------------------------------------------
    async def exchange_id_spin(self, seconds: float) -> None:
        rpc = await rpc_from("127.0.0.2", self.server.port)
        n = delays = 0
        end = time.monotonic() + seconds

        async def spin(k: int) -> None:
            nonlocal n, delays
            while time.monotonic() < end and not rpc.conn.closed:
                n += 1
                try:
                    res = await compound(rpc, [exchange_id(b"spinner-%d-%d" % (k, n))], 5)
                except Exception:
                    await asyncio.sleep(0.05)
                    continue
                if res.status == nfs4.NFS4ERR_DELAY:
                    delays += 1

        try:
            await asyncio.gather(*(spin(k) for k in range(16)))
        finally:
            rpc.close()
        self.phases.setdefault("_notes", {})["4a"] = f"{n} EXCHANGE_IDs sent, {delays} DELAY"

    # 4b -----------------------------------------------------------------------------------------
    async def session_hog(self, seconds: float) -> None:
        """Four client IDs: 63 sessions asking for the largest cached replies, and a 64th that
        takes exactly what is left of the reply-cache budget. Its size is found the way any
        client can: the slots a CREATE_SESSION is granted tell how much room there is (probe
        sessions are destroyed at once). The leases are renewed, and the 64th session is
        re-fitted every second (an honest newcomer that got in and left frees room)."""
        conns = [await rpc_from(ATTACK_SOURCES[i], self.server.port) for i in range(4)]
        hogs = [_Hog(rpc, b"hog-%d" % i) for i, rpc in enumerate(conns)]
        sessions: list[tuple[_Hog, bytes]] = []
        fills = 0
        try:
            for i, hog in enumerate(hogs):
                await hog.exchange()
                for _ in range(16 if i < 3 else 15):
                    sid, _slots = await hog.create(1 << 20, 64)
                    if sid is not None:
                        sessions.append((hog, sid))
            last = hogs[3]
            filler: bytes | None = None
            seqids = dict.fromkeys((sid for _, sid in sessions), 1)
            end = time.monotonic() + seconds
            while time.monotonic() < end:  # keep the leases (and the reservations) alive
                if filler is not None:
                    await last.destroy(filler)
                filler = await last.fill()
                fills += filler is not None
                for hog, sid in sessions:
                    with contextlib.suppress(Exception):
                        res = await compound(hog.rpc, [sequence(sid, seqids[sid])], 5)
                        if res.status == nfs4.NFS4_OK:
                            seqids[sid] += 1
                await asyncio.sleep(1.0)
        finally:
            for rpc in conns:
                rpc.close()
        refused: dict[str, int] = {}
        for h in hogs:
            for k, v in h.refused.items():
                refused[k] = refused.get(k, 0) + v
        self.phases.setdefault("_notes", {})["4b"] = (
            f"{len(sessions)} hog sessions with large cached replies (refused: {refused}), "
            f"budget refilled {fills} times"
        )


class _Hog:
    """One attacking client ID and its CREATE_SESSION sequence."""

    def __init__(self, rpc: RpcConnection, owner: bytes) -> None:
        self.rpc = rpc
        self.owner = owner
        self.clientid = 0
        self.seq = 0
        self.refused: dict[str, int] = {}

    async def exchange(self) -> None:
        for _attempt in range(200):  # NFS4ERR_DELAY (creation rate): try again
            res = await compound(self.rpc, [exchange_id(self.owner)])
            if res.status != nfs4.NFS4ERR_DELAY:
                break
            await asyncio.sleep(0.05)
        if res.status != nfs4.NFS4_OK:
            raise RuntimeError(f"EXCHANGE_ID: {nfs4.nfsstat4(res.status).name}")
        ok = res.resarray[0].value.value
        self.clientid, self.seq = ok.eir_clientid, ok.eir_sequenceid

    async def create(self, cached: int, slots: int) -> tuple[bytes | None, int]:
        """(session id, slots granted), or (None, 0) when refused."""
        for _attempt in range(50):  # NFS4ERR_DELAY (creation rate): try again
            args = create_session(self.clientid, self.seq, cached)
            args.value.csa_fore_chan_attrs.ca_maxrequests = slots
            res = await compound(self.rpc, [args])
            if res.status != nfs4.NFS4ERR_DELAY:
                break
            await asyncio.sleep(0.05)
        if res.status != nfs4.NFS4_OK:
            name = nfs4.nfsstat4(res.status).name
            self.refused[name] = self.refused.get(name, 0) + 1
            return None, 0
        self.seq += 1
        ok = res.resarray[0].value.value
        return bytes(ok.csr_sessionid), int(ok.csr_fore_chan_attrs.ca_maxrequests)

    async def destroy(self, sid: bytes) -> None:
        with contextlib.suppress(Exception):
            await compound(
                self.rpc,
                [nfs4.nfs_argop4(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(sid))],
            )

    async def fill(self) -> bytes | None:
        """A session reserving all but a few bytes of what is left of the budget."""
        lo, hi = 0, (64 << 10)  # cached sizes: find the largest one granted all 64 slots
        sid, got = await self.create(lo, 64)
        if sid is None:
            return None
        await self.destroy(sid)
        if got < 64:  # less than 64 x 256 bytes left: take what a 0-byte cache gets
            return (await self.create(0, 64))[0]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            sid, got = await self.create(mid, 64)
            if sid is not None:
                await self.destroy(sid)
            if got == 64:
                lo = mid
            else:
                hi = mid
        return (await self.create(lo, 64))[0]


async def _session(rpc: RpcConnection, owner: bytes, cached: int) -> bytes:
    res = await compound(rpc, [exchange_id(owner)])
    ok = res.resarray[0].value.value
    res = await compound(rpc, [create_session(ok.eir_clientid, ok.eir_sequenceid, cached)])
    return bytes(res.resarray[0].value.value.csr_sessionid)


def _log_lines(server: ServerProcess) -> int:
    if server.log_path is None or not server.log_path.exists():
        return 0
    with open(server.log_path, "rb") as f:
        return sum(1 for _ in f)


def supported_options(tree: Path) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "nfsrdma", "serve", "--help"],
        capture_output=True, text=True, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
    ).stdout  # fmt: skip
    wanted = {
        "--max-connections",
        "--max-connections-per-source",
        "--idle-timeout",
        "--record-timeout",
    }
    return {o for o in wanted if o in out.split()}


def summary(name: str, ph: dict[str, Any]) -> tuple[float, float, int]:
    lat = [x * 1000 for x in ph.get("lat", [])]
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    conn = [x * 1000 for x in ph.get("connect", [])]
    print(f"{name:22} honest ops {len(lat):5d}  p50 {p50:7.2f} ms  p99 {p99:8.2f} ms  "
          f"newcomer connects {len(conn)} (max {max(conn, default=float('nan')):.0f} ms, "
          f"slots granted {min(ph.get('slots', []), default=0)}..{max(ph.get('slots', []), default=0)})  "
          f"failures {len(ph.get('errors', []))}")  # fmt: skip
    for e in ph.get("errors", [])[:3]:
        print(f"    {e}")
    return p50, p99, len(ph.get("errors", []))


async def abuse(args: argparse.Namespace) -> int:
    scratch = Path(tempfile.mkdtemp(prefix="abuse-", dir=args.dir))
    export, outside = scratch / "export", scratch / "outside"
    export.mkdir()
    outside.mkdir()
    tree = Path(args.server_tree).resolve()
    have = supported_options(tree)
    extra = ["--no-root-squash"]
    if "--max-connections" in have:
        extra += ["--max-connections", str(args.max_connections)]
    if "--max-connections-per-source" in have:
        extra += ["--max-connections-per-source", str(args.max_per_source)]
    if "--idle-timeout" in have:
        extra += ["--idle-timeout", str(args.idle_timeout)]
    if "--record-timeout" in have:  # a first record never completed (slow-loris, silent peers)
        extra += ["--record-timeout", str(args.idle_timeout)]
    missing = {"--max-connections", "--max-connections-per-source", "--idle-timeout"} - have
    step(
        f"server options: {' '.join(extra)}"
        + (f" (not known: {sorted(missing)})" if missing else "")
    )
    server = ServerProcess(export, scratch, extra, nofile=args.server_nofile, tree=tree)
    server.start()
    honest = Honest(server.url)
    run = Run(args, server, export, outside, honest)
    try:
        await honest.start()
        step("idle baseline")
        run.phases["idle"] = await honest.measure("idle", args.phase)
        step("1: directory moved out of the export")
        await run.moved_directory()
        step("2: empty / 2-byte fragment flood")
        await run.under("2 fragment flood", run.fragment_flood)
        step("3: idle connections + slow-loris")
        await run.under("3 connection flood", run.connection_flood)
        step("4a: EXCHANGE_ID spin")
        await run.under("4a EXCHANGE_ID spin", run.exchange_id_spin)
        step("4b: 4 client IDs x 16 sessions with large cached replies")
        await run.under("4b session hog", run.session_hog)
        alive = server.alive()
    finally:
        await honest.stop()
        server.stop()
        tail = server.log_tail(5)
        shutil.rmtree(scratch, ignore_errors=True)
    notes = run.phases.pop("_notes", {})
    _, idle_p99, _ = summary("idle", run.phases["idle"])
    idle_connect = max(run.phases["idle"].get("connect", [0.0]), default=0.0)
    worst = 0.0
    failures = 0
    for name, ph in run.phases.items():
        if name == "idle":
            continue
        _, p99, fails = summary(name, ph)
        failures += fails
        # No honest operation completed (NaN): as bad as it gets.
        ratio = p99 / idle_p99 if idle_p99 > 0 and not math.isnan(p99) else math.inf
        worst = max(worst, ratio)
        slow = [c for c in ph.get("connect", []) if c > max(5 * idle_connect, 1.0)]
        if name.startswith("4") and (fails or slow or not ph.get("connect")):
            run.hole(f"{name}", True, f"newcomer: {fails} failures, {len(slow)} slow connects")
        elif name.startswith("4"):
            run.hole(f"{name}", False, "newcomers got sessions without delay")
    for k, v in notes.items():
        print(f"{k}: {v}")
    for h in run.holes:
        print(f"hole {h.name}: {'OPEN' if h.open else 'closed'} - {h.detail}")
    if not alive:
        print(f"the server died; its log ends: {tail}")
    holes_open = sum(h.open for h in run.holes) + (0 if alive else 1)
    print(f"honest_p99_ratio={worst:.2f} honest_failures={failures} holes_open={holes_open}")
    missed = holes_open > 0 or failures > 0 or worst > 5
    return 1 if missed and args.check else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--honest", metavar="URL", help=argparse.SUPPRESS)
    ap.add_argument("--phase", type=float, default=15.0, help="seconds of each attack phase")
    ap.add_argument("--max-connections", type=int, default=600)
    ap.add_argument("--max-per-source", type=int, default=50)
    ap.add_argument("--idle-timeout", type=float, default=5.0)
    ap.add_argument("--idle-connections", type=int, default=1600, help="attackers' idle sockets")
    ap.add_argument("--loris", type=int, default=40, help="slow-loris connections")
    ap.add_argument("--server-nofile", type=int, default=1024, help="the server's fd limit")
    ap.add_argument("--flood-mib", type=int, default=48, help="fragment flood per connection")
    ap.add_argument("--rss-bound-mib", type=float, default=64.0, help="hole 2: RSS growth bound")
    ap.add_argument("--log-lines-per-min", type=float, default=600.0, help="hole 3: log bound")
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument(
        "--server-tree",
        default=str(Path(__file__).resolve().parent.parent),
        help="the source tree whose server is attacked (this one by default)",
    )
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    if args.honest:
        asyncio.run(honest_main(args.honest))
        return 0
    logging.basicConfig(level=logging.CRITICAL)
    return asyncio.run(abuse(args))


if __name__ == "__main__":
    sys.exit(main())
