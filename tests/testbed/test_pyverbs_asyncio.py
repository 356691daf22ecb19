"""The pyverbs provider under asyncio on rxe0 (issue 3, test 4).

Two asyncio tasks in one process connect through rdma_cm on ``TESTBED_ADDR`` with RFC 8797
private data both ways, then SEND/RECV, RDMA WRITE and RDMA READ with the peer's rkey, and
Send with Invalidate of a memory window. Every CM event and completion reaches the provider
through ``loop.add_reader`` on the rdma_cm and completion channel descriptors; a ticker task
shows the loop never blocks. Negative cases: a wrong rkey fails with an error completion and both
sides see the connection break; a reject carries its private data. Finally the provider's
ping-pong latency and RDMA WRITE/READ throughput are measured next to ib_write_bw/ib_read_bw in
the same boot (ratios only: the guest runs under TCG).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.testbed.helpers import Background, GuestEnv, run, tcp_listening
from nfsrdma.testbed.perftest import loopback_bw
from nfsrdma.transport.rdma import privdata
from nfsrdma.transport.rdma.privdata import PrivateData
from nfsrdma.transport.rdma.provider import (
    Access,
    ConnectionRejected,
    ProviderError,
    QueuePairConfig,
    WcOpcode,
    WcStatus,
)
from tests.unit.rdma.helpers import Events

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not os.environ.get("TESTBED_ADDR"), reason="TESTBED_ADDR unset"),
]

PORT = 20079
CONFIG = QueuePairConfig(max_send_wr=64, max_recv_wr=32, max_send_sge=4, max_inline_data=0)
ALL = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
CLIENT_PD = PrivateData(4096, 4096, remote_invalidate=True)
SERVER_PD = PrivateData(8192, 4096, remote_invalidate=False)
STEP = 60.0  # generous per-step timeout under TCG


@dataclass
class Ticker:
    """Ticks every millisecond; a blocking verbs call would show as a long gap (or a hang)."""

    ticks: int = 0
    max_gap: float = 0.0
    task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.001)
            self.max_gap = max(self.max_gap, loop.time() - before)
            self.ticks += 1

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()


@dataclass
class Readers:
    """The descriptors the provider hands to ``loop.add_reader``, with what they are."""

    fds: dict[int, str] = field(default_factory=dict)


@contextmanager
def recording_readers(loop: asyncio.AbstractEventLoop) -> Iterator[Readers]:
    seen = Readers()
    original = loop.add_reader

    def add_reader(fd: Any, callback: Callable[..., object], *args: Any) -> None:
        seen.fds[int(fd)] = os.readlink(f"/proc/self/fd/{int(fd)}")
        original(fd, callback, *args)

    loop.add_reader = add_reader  # type: ignore[method-assign,assignment]
    try:
        yield seen
    finally:
        loop.add_reader = original  # type: ignore[method-assign]


async def step(aw: Any) -> Any:
    return await asyncio.wait_for(aw, STEP)


@dataclass
class Pair:
    listener: Any
    client: Any
    server: Any
    ce: Events
    se: Events
    client_rbuf: Any
    server_rbuf: Any
    seen: dict[str, bytes]

    def close(self) -> None:
        self.client.close()
        self.server.close()
        self.listener.close()


async def connect(
    dev: Any, addr: str, port: int, *, server_recvs: int = 8, client_recvs: int = 8
) -> Pair:
    """A connected pair through rdma_cm; receives posted before establishment (PD-24)."""
    listener = await dev.listen(port)
    ce, se = Events(), Events()
    server_rbuf = dev.pd.register(server_recvs * 4096, Access.LOCAL_WRITE)
    client_rbuf = dev.pd.register(client_recvs * 4096, Access.LOCAL_WRITE)
    seen: dict[str, bytes] = {}

    async def serve() -> Any:
        request = await listener.get_request()
        seen["request"] = request.private_data
        seen["request_ird_ord"] = bytes([request.responder_resources, request.initiator_depth])
        conn = request.create_connection(CONFIG, se)
        for i in range(server_recvs):
            conn.post_recv(100 + i, server_rbuf.sge(i * 4096, 4096))
        await conn.establish(
            privdata.encode(SERVER_PD),
            responder_resources=0,
            initiator_depth=min(request.initiator_depth, 4),
        )
        return conn

    server_task = asyncio.ensure_future(serve())
    client = await step(dev.resolve(addr, port, CONFIG, ce))
    for i in range(client_recvs):
        client.post_recv(100 + i, client_rbuf.sge(i * 4096, 4096))
    seen["accept"] = await step(
        client.establish(privdata.encode(CLIENT_PD), responder_resources=4, initiator_depth=0)
    )
    server = await step(server_task)
    return Pair(listener, client, server, ce, se, client_rbuf, server_rbuf, seen)


async def test_connect_send_write_read_invalidate(testbed: GuestEnv, rxe: str) -> None:
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    loop = asyncio.get_running_loop()
    ticker = Ticker()
    ticker.start()
    with recording_readers(loop) as readers:
        dev = await open_device(testbed.addr)
        try:
            assert dev.caps.name == rxe
            pair = await connect(dev, testbed.addr, PORT)
            client, server, ce, se, seen = pair.client, pair.server, pair.ce, pair.se, pair.seen
            client_rbuf, server_rbuf = pair.client_rbuf, pair.server_rbuf
            # RFC 8797 private data, both directions (PD-1, PD-13: IB pads to 56 and 196).
            assert len(seen["request"]) == 56 and len(seen["accept"]) == 196
            assert privdata.decode(seen["request"]) == CLIENT_PD
            assert privdata.decode(seen["accept"]) == SERVER_PD
            assert seen["request"][:8] == bytes.fromhex("f6ab0e1801010303")
            assert seen["request_ird_ord"] == bytes([0, 4])  # the client's IRD 4 / ORD 0
            assert (client.responder_resources, client.initiator_depth) == (4, 0)
            assert (server.responder_resources, server.initiator_depth) == (0, 4)

            # SEND/RECV both ways, two SGEs gathered.
            out = dev.pd.register(65536, Access.LOCAL_WRITE)
            out.buffer[0:5] = b"hello"
            out.buffer[1000:1006] = b"world!"
            client.post_send(1, [out.sge(0, 5), out.sge(1000, 6)])
            assert (await step(ce.wait_completion(1))).ok
            recv = await step(se.wait_completion(100))
            assert (recv.ok, recv.opcode, recv.byte_len) == (True, WcOpcode.RECV, 11)
            assert bytes(server_rbuf.buffer[0:11]) == b"helloworld!"
            out.buffer[2000:2005] = b"reply"
            server.post_send(2, [out.sge(2000, 5)])
            assert (await step(ce.wait_completion(100))).byte_len == 5
            assert bytes(client_rbuf.buffer[0:5]) == b"reply"

            # RDMA WRITE and READ by the server with the client's rkey.
            exposed = dev.pd.register(65536, ALL)
            payload = bytes(range(256)) * 64  # 16 KiB
            out.buffer[0 : len(payload)] = payload
            server.post_rdma_write(3, [out.sge(0, len(payload))], exposed.addr + 4096, exposed.rkey)
            assert (await step(se.wait_completion(3))).ok
            assert bytes(exposed.buffer[4096 : 4096 + len(payload)]) == payload
            exposed.buffer[40000:40010] = b"read me!!!"
            sink = dev.pd.register(4096, Access.LOCAL_WRITE)
            server.post_rdma_read(
                4, [sink.sge(0, 4), sink.sge(100, 6)], exposed.addr + 40000, exposed.rkey
            )
            read = await step(se.wait_completion(4))
            assert (read.ok, read.opcode, read.byte_len) == (True, WcOpcode.RDMA_READ, 10)
            assert bytes(sink.buffer[0:4]) + bytes(sink.buffer[100:106]) == b"read me!!!"

            # A memory window invalidated by the server's Send with Invalidate (PD-17 b).
            assert dev.caps.memory_windows and dev.caps.remote_invalidate
            mw_region = dev.pd.register(8192, ALL | Access.MW_BIND)
            window = dev.pd.alloc_window()
            rkey = client.post_bind_window(5, window, mw_region, 4096, 1024, Access.REMOTE_WRITE)
            assert (await step(ce.wait_completion(5))).ok
            server.post_rdma_write(6, [out.sge(0, 8)], mw_region.addr + 4096, rkey)
            assert (await step(se.wait_completion(6))).ok
            assert bytes(mw_region.buffer[4096:4104]) == payload[:8]
            server.post_send(7, [out.sge(2000, 5)], invalidate_rkey=rkey)
            assert (await step(se.wait_completion(7))).ok
            inv = await step(ce.wait_completion(101))
            assert inv.ok and inv.invalidated_rkey == rkey
            window.close()

            assert not ce.disconnects and not se.disconnects
            # The watched descriptors are non-blocking: a read with nothing ready cannot hang.
            for fd in readers.fds:
                assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK, readers.fds[fd]
            client.disconnect()
            assert (await step(ce.wait_disconnect())).reason == "local disconnect"
            assert (await step(se.wait_disconnect())).reason == "peer disconnected"
            pair.close()
        finally:
            dev.close()
    ticker.stop()
    # Events came through the channels' descriptors (add_reader), not by blocking calls.
    kinds = set(readers.fds.values())
    assert "/dev/infiniband/rdma_cm" in kinds
    assert "anon_inode:[infinibandevent]" in kinds
    assert ticker.ticks >= 5, ticker
    assert ticker.max_gap < 0.5, ticker
    print(f"\nticker: {ticker.ticks} ticks, longest gap {ticker.max_gap * 1000:.1f} ms")


async def test_wrong_rkey_breaks_the_connection(testbed: GuestEnv, rxe: str) -> None:
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    dev = await open_device(testbed.addr)
    try:
        pair = await connect(dev, testbed.addr, PORT + 1, server_recvs=2, client_recvs=2)
        client, server, ce, se = pair.client, pair.server, pair.ce, pair.se
        exposed = dev.pd.register(4096, ALL)
        local = dev.pd.register(4096, Access.LOCAL_WRITE)
        server.post_rdma_write(1, [local.sge(0, 64)], exposed.addr, exposed.rkey ^ 0x5A00)
        failed = await step(se.wait_completion(1))
        assert failed.status is WcStatus.REM_ACCESS_ERR
        assert (await step(se.wait_disconnect())).status is WcStatus.REM_ACCESS_ERR
        assert server.broken
        await step(ce.wait_disconnect())  # the provider disconnected the peer through the CM
        assert client.broken
        # Every receive posted on either side flushes.
        await step(se.wait(lambda ev: len(ev.completions) == 3))
        assert [c.status for c in se.completions[1:]] == [WcStatus.WR_FLUSH_ERR] * 2
        await step(ce.wait(lambda ev: len(ev.completions) == 2))
        assert [c.status for c in ce.completions] == [WcStatus.WR_FLUSH_ERR] * 2
        server.post_send(9, [local.sge(0, 8)])  # posting after the break only flushes
        assert (await step(se.wait_completion(9))).status is WcStatus.WR_FLUSH_ERR
        pair.close()
    finally:
        dev.close()


async def test_send_with_invalidate_of_a_plain_region_fails(testbed: GuestEnv, rxe: str) -> None:
    """On rxe, as the in-process provider emulates it (tests/unit/rdma/test_inproc.py): a Send
    with Invalidate naming the rkey of a plain region (``ibv_reg_mr``, not a memory window or
    a fast-registered region) cannot be invalidated by the receiver, so its receive fails with
    REM_INV_REQ_ERR, the region is left as it was, and both sides see the connection break.
    This is why the server sends with invalidate only for a requester that advertised it."""
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    dev = await open_device(testbed.addr)
    try:
        pair = await connect(dev, testbed.addr, PORT + 5, server_recvs=2, client_recvs=1)
        client, server, ce, se = pair.client, pair.server, pair.ce, pair.se
        plain = dev.pd.register(4096, ALL)  # the client's region: a plain memory region
        local = dev.pd.register(64, Access.LOCAL_WRITE)
        local.buffer[0:4] = b"data"
        server.post_send(1, [local.sge(0, 4)], invalidate_rkey=plain.rkey)
        recv = await step(ce.wait_completion(100))
        assert recv.status is WcStatus.REM_INV_REQ_ERR, ce.items
        assert (await step(ce.wait_disconnect())).status is WcStatus.REM_INV_REQ_ERR
        await step(se.wait_disconnect())  # the provider disconnected the peer through the CM
        assert client.broken and server.broken
        # The region is still valid: a fresh connection can still RDMA-write into it.
        again = await connect(dev, testbed.addr, PORT + 6, server_recvs=1, client_recvs=1)
        again.server.post_rdma_write(2, [local.sge(0, 4)], plain.addr + 8, plain.rkey)
        assert (await step(again.se.wait_completion(2))).ok
        assert bytes(plain.buffer[8:12]) == b"data"
        again.close()
        pair.close()
    finally:
        dev.close()


async def test_reject_carries_private_data(testbed: GuestEnv, rxe: str) -> None:
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    dev = await open_device(testbed.addr)
    try:
        listener = await dev.listen(PORT + 2)
        client = await step(dev.resolve(testbed.addr, PORT + 2, CONFIG, Events()))
        connecting = asyncio.ensure_future(client.establish(privdata.encode(CLIENT_PD)))
        request = await step(listener.get_request())
        assert privdata.decode(request.private_data) == CLIENT_PD
        request.reject(b"not today")
        with pytest.raises(ConnectionRejected) as rejected:
            await step(connecting)
        assert rejected.value.private_data.startswith(b"not today")
        client.close()
        listener.close()
    finally:
        dev.close()


async def test_events_reach_the_right_connection(testbed: GuestEnv, rxe: str) -> None:
    """Two connections through one listener: their CM events share the listener's channel and
    are told apart by the event's rdma_cm_id; disconnecting one leaves the other working."""
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    with pytest.raises(ProviderError):
        await open_device("10.99.99.99")  # no device has it
    dev = await open_device(testbed.addr)
    try:
        listener = await dev.listen(PORT + 4)
        buf = dev.pd.register(8 * 4096, Access.LOCAL_WRITE)
        pairs = []
        for n in range(2):
            ce, se = Events(), Events()
            client = await step(dev.resolve(testbed.addr, PORT + 4, CONFIG, ce))
            connecting = asyncio.ensure_future(client.establish(responder_resources=1))
            request = await step(listener.get_request())
            server = request.create_connection(CONFIG, se)
            server.post_recv(100, buf.sge(n * 4096, 4096))
            await step(server.establish(initiator_depth=1))
            await step(connecting)
            # Both ends name the other as host:port, read from the rdma_cm identifier.
            assert client.peer == f"{testbed.addr}:{PORT + 4}"
            host, _, port = server.peer.rpartition(":")
            assert host == testbed.addr and 0 < int(port) != PORT + 4, server.peer
            assert request.peer == server.peer
            pairs.append((client, server, ce, se))
        (c0, s0, _ce0, se0), (c1, s1, ce1, se1) = pairs
        assert s0.peer != s1.peer  # two connections from one host: two source ports
        c0.disconnect()
        await step(se0.wait_disconnect())
        assert not se1.disconnects and not ce1.disconnects
        buf.buffer[4 * 4096 : 4 * 4096 + 3] = b"one"
        c1.post_send(1, [buf.sge(4 * 4096, 3)])
        assert (await step(se1.wait_completion(100))).byte_len == 3
        assert bytes(buf.buffer[4096:4099]) == b"one"
        for conn in (c0, s0, c1, s1):
            conn.close()
        listener.close()
    finally:
        dev.close()


async def _ping_pong(
    client: Any, server: Any, ce: Events, se: Events, out: Any, pair: Pair, n: int
) -> float:
    """Round trips of a 64-byte Send each way, each message numbered and checked where it
    lands (the pair's receive buffers); receives reposted as they complete."""
    start = time.perf_counter()
    for i in range(n):
        ping, pong = (b"ping%08d" % i).ljust(64, b"."), (b"pong%08d" % i).ljust(64, b".")
        out.buffer[0:64] = ping
        out.buffer[64:128] = pong
        client.post_send(1000 + i, [out.sge(0, 64)])
        got = await se.wait_completion(100 + i % 8)
        se.items.clear()
        assert got.ok and got.byte_len == 64
        slot = (got.wr_id - 100) * 4096
        assert bytes(pair.server_rbuf.buffer[slot : slot + 64]) == ping
        server.post_recv(got.wr_id, pair.server_rbuf.sge(slot, 4096))
        server.post_send(5000 + i, [out.sge(64, 64)])
        await ce.wait(lambda ev: any(c.opcode is WcOpcode.RECV for c in ev.completions))
        recv = next(c for c in ce.completions if c.opcode is WcOpcode.RECV)
        ce.items.clear()
        assert recv.ok and recv.byte_len == 64
        slot = (recv.wr_id - 100) * 4096
        assert bytes(pair.client_rbuf.buffer[slot : slot + 64]) == pong
        client.post_recv(recv.wr_id, pair.client_rbuf.sge(slot, 4096))
    return (time.perf_counter() - start) / n


async def _rdma_bw(
    conn: Any, events: Events, op: str, local: Any, remote: Any, size: int, n: int
) -> float:
    """Bytes/s of ``n`` RDMA operations of ``size`` bytes, up to 16 in flight; every one
    completes once, successfully, and the bytes arrive intact (checked by digest)."""
    post = conn.post_rdma_write if op == "write" else conn.post_rdma_read
    source, sink = (local, remote) if op == "write" else (remote, local)
    source.buffer[0:size] = os.urandom(size)
    sink.buffer[0:size] = bytes(size)
    depth = 16
    start = time.perf_counter()
    posted = done = 0
    completed: set[int] = set()
    while done < n:
        while posted < n and posted - done < depth:
            post(10_000 + posted, [local.sge(0, size)], remote.addr, remote.rkey)
            posted += 1
        await events.wait(lambda ev: bool(ev.completions))
        for c in events.completions:
            assert c.ok, c
            completed.add(c.wr_id)
        done += len(events.completions)
        events.items.clear()
    elapsed = time.perf_counter() - start
    assert completed == set(range(10_000, 10_000 + n))  # each exactly once
    want = hashlib.sha256(bytes(source.buffer[0:size])).digest()
    assert hashlib.sha256(bytes(sink.buffer[0:size])).digest() == want
    return n * size / elapsed


def rc_pingpong_rtt_us(addr: str, rxe: str, log_dir: Path, iters: int, size: int) -> float:
    """``ibv_rc_pingpong`` (C, busy-polling, no CM) round trip in microseconds."""
    argv = ["ibv_rc_pingpong", "-d", rxe, "-g", "1", "-s", str(size), "-n", str(iters)]
    argv += ["-p", "18520"]
    with Background(argv, log=log_dir / "ibv_rc_pingpong-server.log") as server:
        server.wait_ready(lambda: tcp_listening(18520), timeout=60)
        client = run([*argv, addr], timeout=300)
    (log_dir / "ibv_rc_pingpong-client.log").write_text(client.stdout + client.stderr)
    found = re.search(r"([\d.]+) usec/iter", client.stdout + client.stderr)
    assert found, client.stdout + client.stderr
    return float(found.group(1))


async def test_measure_against_perftest(testbed: GuestEnv, rxe: str, artefacts: Path) -> None:
    """Ping-pong and RDMA WRITE/READ streams through the provider, every message and every
    byte checked where it lands; next to them ib_write_bw/ib_read_bw and ibv_rc_pingpong in the
    same boot. The figures and ratios are written to the artefacts directory for the record;
    no speed is asserted here (speed targets belong in bench/, bench/testbed_baseline.py)."""
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    size, n = 65536, 200
    dev = await open_device(testbed.addr)
    try:
        pair = await connect(dev, testbed.addr, PORT + 3)
        client, server, ce, se = pair.client, pair.server, pair.ce, pair.se
        out = dev.pd.register(65536 + 8 * 4096, Access.LOCAL_WRITE)
        latency = await step(_ping_pong(client, server, ce, se, out, pair, 200))
        exposed = dev.pd.register(size, ALL)
        local = dev.pd.register(size, Access.LOCAL_WRITE)
        ce.items.clear()
        se.items.clear()
        write_bw = await step(_rdma_bw(server, se, "write", local, exposed, size, n))
        read_bw = await step(_rdma_bw(server, se, "read", local, exposed, size, n))
        pair.close()
    finally:
        dev.close()
    perf_write = loopback_bw("ib_write_bw", log_dir=artefacts, size=size, iterations=n)
    perf_read = loopback_bw("ib_read_bw", log_dir=artefacts, size=size, iterations=n)
    c_rtt = rc_pingpong_rtt_us(testbed.addr, rxe, artefacts, 200, 64)
    figures = {
        "pingpong_rtt_us": latency * 1e6,
        "ibv_rc_pingpong_rtt_us": c_rtt,
        "rtt_ratio": latency * 1e6 / c_rtt,
        "provider_write_MBps": write_bw / 1e6,
        "provider_read_MBps": read_bw / 1e6,
        "ib_write_bw_MBps": perf_write.average_mb_s,
        "ib_read_bw_MBps": perf_read.average_mb_s,
        "write_ratio": write_bw / 1e6 / perf_write.average_mb_s,
        "read_ratio": read_bw / 1e6 / perf_read.average_mb_s,
        "size": size,
        "iterations": n,
    }
    (artefacts / "pyverbs_provider_figures.json").write_text(json.dumps(figures, indent=2))
    print("\n" + json.dumps(figures, indent=2))
    # What the C tools report is what they were asked to move.
    assert (perf_write.msg_bytes, perf_write.iterations) == (size, n)
    assert (perf_read.msg_bytes, perf_read.iterations) == (size, n)
