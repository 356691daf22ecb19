"""Grace after a restart is cluster-wide on CephFS: while the clients of a restarted server
reclaim from it, another server in front of the same CephFS refuses new state
(NFS4ERR_GRACE) too, and admits it once they are done (``vfs/ceph/grace.py``)."""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from pathlib import Path

import nfsrdma.client as nc
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.testbed.ceph_cluster import CephCluster
from nfsrdma.vfs.ceph.grace import ClusterGrace
from nfsrdma.vfs.ceph.vfs import CephVfs


def _server(cluster: CephCluster, pool: str, node: str, state: Path, port: int = 0) -> NFSServer:
    return NFSServer(
        "cephfs:/",
        bind="127.0.0.1",
        tcp_port=port,
        rdma_port=None,
        root_squash=False,
        state_dir=str(state),
        config=ServerConfig(lease_time=10, grace_time=60),
        backend=functools.partial(CephVfs, conf=str(cluster.conf), grace_pool=pool),
        node_name=node,
    )


def _shared(server: NFSServer) -> ClusterGrace:
    assert server.state is not None
    shared = server.state.grace.shared
    assert isinstance(shared, ClusterGrace)
    return shared


async def test_a_restart_puts_every_server_in_grace_until_its_clients_reclaimed(
    ceph_cluster: CephCluster, tmp_path: Path
) -> None:
    pool = f"grace-{uuid.uuid4().hex[:8]}"
    a = _server(ceph_cluster, pool, "a", tmp_path / "a")
    b = _server(ceph_cluster, pool, "b", tmp_path / "b")
    await a.start()
    await b.start()
    port = a.tcp_port
    name = f"grace-{uuid.uuid4().hex[:6]}"
    try:
        async with nc.connect(f"nfs://127.0.0.1:{port}/", uid=0, gid=0, timeout=2.0) as x:
            f = await x.open(name, "wb")
            await f.write(b"before")
            await f.fsync()
            await f.lock(0, 6)
            assert not _shared(b).in_grace()
            await a.close()  # A restarts: its state goes, its client records stay
            a = _server(ceph_cluster, pool, "a", tmp_path / "a", port)
            await a.start()
            assert a.state is not None and a.state.grace.previous == {x.session.opts.owner}
            _shared(b).refresh()
            assert _shared(b).in_grace()  # B learnt of A's grace period from RADOS
            async with nc.connect(f"nfs://127.0.0.1:{b.tcp_port}/", uid=0, gid=0) as y:
                opening = asyncio.create_task(y.write_bytes(f"{name}-y", b"new state"))
                deadline = time.monotonic() + 20
                while y.session.stats.delays == 0:  # B answered NFS4ERR_GRACE (retried)
                    assert time.monotonic() < deadline and not opening.done()
                    await asyncio.sleep(0.05)
                assert not opening.done()
                await f.write(b"after")  # X notices the restart and reclaims from A
                await f.fsync()
                assert a.state.grace.ended_why == "every client reclaimed"
                await asyncio.wait_for(opening, 30)  # B learns it from RADOS, admits Y's OPEN
                assert not _shared(b).in_grace()
                assert await y.read_bytes(f"{name}-y") == b"new state"
            assert f.locks, "the lock was not reclaimed"
            await f.close()
            assert await x.read_bytes(name) == b"beforeafter"
    finally:
        await a.close()
        await b.close()
    assert os.path.isdir(tmp_path / "a")
