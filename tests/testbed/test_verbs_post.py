"""Send-queue posts without the GIL (verbs_direct) on rxe0: data moves byte-exact.

For each post path (``direct``: ctypes on the loop thread; ``thread``: one thread per queue
pair, everything offloaded): two pyverbs connections in this process check that the raw verbs
objects were found (the path is the one asked for, not the pyverbs fallback), then Sends with
gathered SGEs, RDMA Write and RDMA Read of 64 KiB with several SGEs, Writes chained before a
Send, sixteen RDMA Reads posted back to back (order per queue pair), a memory window bound
and invalidated by Send with Invalidate, and a wrong rkey breaking the connection. Then our
server on that path: the Linux client (RDMA mount) and our client write and read files
byte-exact (the server pulls WRITE data by RDMA Read and pushes READ data by RDMA Write).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.testbed.constants import OURS_RDMA_PORT
from nfsrdma.testbed.helpers import GuestEnv, MountFactory, drop_caches
from nfsrdma.testbed.ours import our_server
from nfsrdma.transport.rdma.provider import Access, RdmaWriteRequest, WcOpcode, WcStatus
from tests.testbed.test_pyverbs_asyncio import ALL, connect, step

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.skipif(not os.environ.get("TESTBED_ADDR"), reason="TESTBED_ADDR unset"),
]

PORT = 20081
PATHS = ["direct", "thread"]


@pytest.fixture
def post_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("NFSRDMA_VERBS_POST", request.param)
    monkeypatch.setenv("NFSRDMA_VERBS_OFFLOAD_BYTES", "0")
    yield request.param


@pytest.mark.parametrize("post_path", PATHS, indirect=True)
async def test_provider_moves_data_byte_exact(post_path: str, testbed: GuestEnv) -> None:
    from nfsrdma.transport.rdma.pyverbs_provider import open_device

    dev = await open_device(testbed.addr)
    try:
        pair = await connect(dev, testbed.addr, PORT + PATHS.index(post_path), client_recvs=16)
        client, server, ce, se = pair.client, pair.server, pair.ce, pair.se
        assert client.post_path == post_path and server.post_path == post_path
        rng = hashlib.sha256(post_path.encode())

        def noise(n: int) -> bytes:
            out = bytearray()
            while len(out) < n:
                rng.update(b"x")
                out += rng.digest()
            return bytes(out[:n])

        out = dev.pd.register(1 << 18, Access.LOCAL_WRITE)
        exposed = dev.pd.register(1 << 18, ALL)
        sink = dev.pd.register(1 << 18, Access.LOCAL_WRITE)

        # Sends both ways, SGEs gathered.
        out.buffer[0:100] = noise(100)
        out.buffer[5000:5300] = noise(300)
        client.post_send(1, [out.sge(0, 100), out.sge(5000, 300)])
        recv = await step(se.wait_completion(100))
        assert (recv.ok, recv.byte_len) == (True, 400)
        assert bytes(pair.server_rbuf.buffer[0:400]) == bytes(out.buffer[0:100]) + bytes(
            out.buffer[5000:5300]
        )
        assert (await step(ce.wait_completion(1))).ok
        server.post_send(2, [out.sge(0, 64)])
        assert (await step(ce.wait_completion(100))).byte_len == 64
        assert bytes(pair.client_rbuf.buffer[0:64]) == bytes(out.buffer[0:64])
        assert (await step(se.wait_completion(2))).ok

        # RDMA Write of 64 KiB from three SGEs, then RDMA Read of it into four.
        data = noise(65536)
        out.buffer[0:20000] = data[:20000]
        out.buffer[30000:60000] = data[20000:50000]
        out.buffer[70000:85536] = data[50000:]
        sges = [out.sge(0, 20000), out.sge(30000, 30000), out.sge(70000, 15536)]
        server.post_rdma_write(3, sges, exposed.addr + 1000, exposed.rkey)
        assert (await step(se.wait_completion(3))).ok
        assert bytes(exposed.buffer[1000:66536]) == data
        parts = [
            sink.sge(0, 1),
            sink.sge(10, 30000),
            sink.sge(40000, 20000),
            sink.sge(70000, 15535),
        ]
        server.post_rdma_read(4, parts, exposed.addr + 1000, exposed.rkey)
        read = await step(se.wait_completion(4))
        assert (read.ok, read.opcode, read.byte_len) == (True, WcOpcode.RDMA_READ, 65536)
        got = b"".join(
            bytes(sink.buffer[p.addr - sink.addr : p.addr - sink.addr + p.length]) for p in parts
        )
        assert got == data

        # RDMA Writes chained before a Send: one post; the Send lands after the data.
        chunks = [noise(8192), noise(12288)]
        out.buffer[100000:108192] = chunks[0]
        out.buffer[110000:122288] = chunks[1]
        out.buffer[130000:130010] = b"after data"
        writes = [
            RdmaWriteRequest(10, [out.sge(100000, 8192)], exposed.addr + 100000, exposed.rkey),
            RdmaWriteRequest(11, [out.sge(110000, 12288)], exposed.addr + 120000, exposed.rkey),
        ]
        server.post_send(12, [out.sge(130000, 10)], writes=writes)
        recv = await step(ce.wait_completion(101))
        assert bytes(pair.client_rbuf.buffer[4096 : 4096 + 10]) == b"after data"
        assert bytes(exposed.buffer[100000:108192]) == chunks[0]
        assert bytes(exposed.buffer[120000:132288]) == chunks[1]
        for i in (10, 11, 12):
            assert (await step(se.wait_completion(i))).ok

        # Sixteen RDMA Reads posted back to back, each 4 KiB of another place.
        exposed.buffer[140000 : 140000 + 65536] = noise(65536)
        for i in range(16):
            server.post_rdma_read(
                20 + i, [sink.sge(i * 4096, 4096)], exposed.addr + 140000 + i * 4096, exposed.rkey
            )
        for i in range(16):
            assert (await step(se.wait_completion(20 + i))).ok
        assert bytes(sink.buffer[0:65536]) == bytes(exposed.buffer[140000 : 140000 + 65536])

        # A memory window: bound (pyverbs post), written through, invalidated by the Send.
        mw_region = dev.pd.register(8192, ALL | Access.MW_BIND)
        window = dev.pd.alloc_window()
        rkey = client.post_bind_window(40, window, mw_region, 4096, 1024, Access.REMOTE_WRITE)
        assert (await step(ce.wait_completion(40))).ok
        server.post_rdma_write(41, [out.sge(0, 16)], mw_region.addr + 4096, rkey)
        assert (await step(se.wait_completion(41))).ok
        assert bytes(mw_region.buffer[4096:4112]) == bytes(out.buffer[0:16])
        server.post_send(42, [out.sge(0, 8)], invalidate_rkey=rkey)
        inv = await step(ce.wait_completion(102))
        assert inv.ok and inv.invalidated_rkey == rkey
        assert (await step(se.wait_completion(42))).ok
        window.close()

        # A wrong rkey: an error completion, the connection breaks on both sides.
        server.post_rdma_read(50, [sink.sge(0, 64)], exposed.addr, exposed.rkey ^ 0x5A5A00)
        bad = await step(se.wait_completion(50))
        assert bad.status is not WcStatus.SUCCESS
        await step(se.wait_disconnect())
        await step(ce.wait_disconnect())
        pair.close()
    finally:
        dev.close()


@pytest.mark.parametrize("post_path", ["thread"], indirect=True)
async def test_our_server_on_the_post_thread(
    post_path: str, testbed: GuestEnv, nfs_mount: MountFactory
) -> None:
    payloads = {f"f{i}": os.urandom(n) for i, n in enumerate((1, 4096, 300_000, 1_048_577))}
    with our_server("verbspost") as ours:
        with nfs_mount(ours.server("rdma")) as m:
            assert m.stats().xprt == "rdma"
            for name, data in payloads.items():
                Path(m.mountpoint, name).write_bytes(data)
            os.sync()
            for name, data in payloads.items():
                assert (ours.export / name).read_bytes() == data, name
        drop_caches()
        with nfs_mount(ours.server("rdma")) as m:
            for name, data in payloads.items():
                assert Path(m.mountpoint, name).read_bytes() == data, name
        # Our client (its own sends on the post thread too) against our server.
        url = f"rdma://{testbed.addr}:{OURS_RDMA_PORT}/"
        async with nc.connect(url, uid=0, gid=0) as fs:
            rpc = fs.session.rpc
            assert rpc is not None and rpc.conn.kind == "rdma"
            for name, data in payloads.items():
                assert await fs.read_bytes(name) == data, name
                await fs.write_bytes(f"ours-{name}", data[::-1])
            for name, data in payloads.items():
                assert (ours.export / f"ours-{name}").read_bytes() == data[::-1], name
        log = ours.proc.log.read_text()
        assert "send queues posted by: thread" in log, "the server did not use the post thread"
