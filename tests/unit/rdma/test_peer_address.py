"""RDMA connections name their peer as host:port, as TCP ones do (per-source limits key on
it); the in-process provider gives each active side an ephemeral source port."""

from __future__ import annotations

import asyncio

from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaListener, connect_rdma
from nfsrdma.transport.rdma.inproc import InprocFabric


async def test_both_ends_report_the_remote_host_and_port() -> None:
    fabric = InprocFabric()
    sdev, cdev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    accepted: asyncio.Queue[RdmaConnection] = asyncio.Queue()
    listener = RdmaListener(sdev, 20049, accepted.put_nowait)
    await listener.start()
    clients = [await asyncio.wait_for(connect_rdma(cdev, "10.0.0.1", 20049), 5) for _ in range(2)]
    servers = [await asyncio.wait_for(accepted.get(), 5) for _ in range(2)]
    assert [c.peer for c in clients] == ["10.0.0.1:20049"] * 2
    for server in servers:
        host, _, port = server.peer.rpartition(":")
        assert host == "10.0.0.2" and int(port) > 0
    assert servers[0].peer != servers[1].peer  # two connections, two source ports
    for conn in (*clients, *servers):
        conn.close()
    await listener.close()
    sdev.close()
    cdev.close()
