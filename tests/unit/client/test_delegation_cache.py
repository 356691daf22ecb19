"""Our client under a read delegation (RFC 8881 sections 10.2, 10.4, 20.2): it asks for one
on read-only opens, serves repeated stat/read from cache without COMPOUNDs, and on CB_RECALL
drops the cache and returns the delegation, after which it reads what the other client wrote.
Against our own NFSServer in this process over TCP on 127.0.0.1 (a real back channel)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nfsrdma
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer


async def test_read_delegation_caches_and_is_returned_on_recall(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    (export / "f").write_bytes(b"first version")
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
        config=ServerConfig(),
    )
    await server.start()
    try:
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nfsrdma.connect(url) as reader, nfsrdma.connect(url) as writer:
            assert server.state is not None and server.state.delegation_service is not None
            svc = server.state.delegation_service
            assert reader.session.clientid is not None
            assert await svc.probe(reader.session.clientid)
            f = await reader.open("f", "rb")
            assert f.delegation is not None and f.cache is not None
            assert await f.read() == b"first version"
            st = await f.stat()
            calls = reader.session.stats.calls
            for _ in range(3):  # served from the cache: no COMPOUND at all
                await f.seek(0)
                assert await f.read() == b"first version"
                assert (await f.stat()).st_size == st.st_size == len(b"first version")
            assert reader.session.stats.calls == calls
            assert reader.io_stats.cached_reads >= 3
            # Another client writes: the server recalls, our client returns and forgets.
            returned = asyncio.Event()
            reader.session.callbacks.recall_listeners.append(lambda _r: returned.set())
            async with writer.open("f", "r+b") as w:
                await w.write(b"FIRST")
            assert returned.is_set()
            assert reader.session.stats.recalls == 1
            assert f.delegation is None and f.cache is None
            await f.seek(0)
            assert await f.read() == b"FIRST version"
            assert reader.session.stats.calls > calls
            await f.close()
    finally:
        await server.close()


async def test_a_revoked_delegation_drops_the_cache_and_is_freed(tmp_path: Path) -> None:
    """RECALLABLE_STATE_REVOKED in a SEQUENCE reply: the client tests its delegations,
    forgets the revoked one and frees it (the flag goes)."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "f").write_bytes(b"first version")
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
    )
    await server.start()
    try:
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nfsrdma.connect(url) as reader, nfsrdma.connect(url) as writer:
            assert server.state is not None and server.state.delegation_service is not None
            svc = server.state.delegation_service
            assert reader.session.clientid is not None
            assert await svc.probe(reader.session.clientid)
            f = await reader.open("f", "rb")
            assert f.cache is not None and await f.read() == b"first version"

            async def ignore(stateid: Any, fh: bytes) -> None:  # a holder that never returns
                return None

            reader.session.callbacks.return_delegation = ignore  # type: ignore[method-assign]
            recalled = asyncio.Event()
            freed = asyncio.Event()
            table = svc.table
            send, flag = table.recall, table.on_revoked
            assert send is not None and flag is not None

            def recall(d: Any) -> None:
                recalled.set()
                send(d)

            def revoked_flag(clientid: int, on: bool) -> None:
                flag(clientid, on)
                if not on:
                    freed.set()

            table.recall, table.on_revoked = recall, revoked_flag

            async def write() -> None:
                async with writer.open("f", "r+b") as w:
                    await w.write(b"FIRST")

            writing = asyncio.ensure_future(write())
            await recalled.wait()
            d = table.on_file(f.fh)[0]
            assert d.recalled is not None
            assert svc.expire(d.recalled + svc.lease_time + 1) == [d]
            await writing
            assert f.cache is None  # dropped on the recall already
            assert reader.session.delegations  # but not given back: it does not know yet
            await reader.session.compound([])  # any SEQUENCE carries the flag
            async with asyncio.timeout(30):  # a guard: the FREE_STATEID follows at once
                await freed.wait()
            assert not reader.session.delegations
            await f.seek(0)
            assert await f.read() == b"FIRST version"
            await f.close()
    finally:
        await server.close()


async def test_recall_over_the_rdma_back_channel(tmp_path: Path) -> None:
    """The holder on RPC-over-RDMA (in-process verbs): CB_RECALL comes on its own connection
    (RFC 8167), it returns the delegation, the writer on TCP gets in."""
    from nfsrdma.client.fs import NfsClient
    from nfsrdma.client.url import parse_url
    from nfsrdma.session.client import ClientSession
    from nfsrdma.session.client_setup import SessionOptions
    from nfsrdma.transport.base import Connection
    from nfsrdma.transport.rdma.endpoint import connect_rdma
    from nfsrdma.transport.rdma.inproc import InprocFabric

    export = tmp_path / "export"
    export.mkdir()
    (export / "f").write_bytes(b"first version")
    fabric = InprocFabric()
    sdev, cdev = fabric.device("10.9.0.1"), fabric.device("10.9.0.2")
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=20049, rdma_device=sdev,
        root_squash=False, state_dir=str(tmp_path / "state"),
    )  # fmt: skip
    await server.start()

    async def connect() -> Connection:
        return await connect_rdma(cdev, "10.9.0.1", 20049)

    session = ClientSession(connect, SessionOptions(uid=0, gid=0, backchannel=True))
    try:
        await session.start()
        reader = NfsClient(session, parse_url("rdma://10.9.0.1/"))
        await reader.mount()
        assert server.state is not None and server.state.delegation_service is not None
        assert session.clientid is not None
        assert await server.state.delegation_service.probe(session.clientid)
        f = await reader.open("f", "rb")
        assert f.cache is not None and await f.read() == b"first version"
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nfsrdma.connect(url) as writer, writer.open("f", "r+b") as w:
            await w.write(b"FIRST")
        assert session.stats.recalls == 1 and f.cache is None
        await f.seek(0)
        assert await f.read() == b"FIRST version"
        await f.close()
        await reader.aclose()
    finally:
        await session.close()
        await server.close()
