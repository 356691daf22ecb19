"""The MDS of the CephFS behind our server dies mid-workload and comes back: meanwhile the
server keeps answering (NFS4ERR_DELAY instead of hanging on Ceph, ``vfs/ceph/guard.py``), the
client retries, and the workload then completes with nothing lost. The server runs in a
child process, so that a server hanging on Ceph fails the test instead of stopping it."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import nfsrdma.client as nc
from nfsrdma.testbed.ceph_cluster import CephCluster

from .ganesha import free_port
from .ourserver import OurServer


async def test_mds_outage_gives_delay_then_the_workload_completes(
    ceph_cluster: CephCluster, tmp_path: Path
) -> None:
    server = OurServer(tmp_path, free_port(), None, ceph_conf=ceph_cluster.conf).start()
    top = f"outage-{uuid.uuid4().hex[:6]}"
    files = {f"{top}/f{i}": os.urandom(5000 + i) for i in range(12)}
    try:
        async with nc.connect(server.url(), uid=0, gid=0, timeout=5.0) as fs:
            await fs.mkdir(top)
            ceph_cluster.kill_daemon("mds.a")

            async def workload() -> None:
                for path, data in files.items():
                    await fs.write_bytes(path, data)

            running = asyncio.create_task(workload())
            deadline = time.monotonic() + 60
            while fs.session.stats.delays == 0:  # the server said NFS4ERR_DELAY, not nothing
                assert time.monotonic() < deadline and not running.done()
                await asyncio.sleep(0.1)
            assert not running.done()
            ceph_cluster.restart_daemon("mds.a")
            await asyncio.wait_for(running, 180)
            for path, data in files.items():
                assert await fs.read_bytes(path) == data
            assert sorted(await fs.listdir(top)) == sorted(p.split("/")[1] for p in files)
    finally:
        if "mds.a" not in ceph_cluster.pids:
            ceph_cluster.restart_daemon("mds.a")
        server.stop()


def test_a_stopped_cluster_leaves_no_daemon_behind_after_an_mds_restart(tmp_path: Path) -> None:
    """A cluster of its own: its MDS killed and started again (as the test above does), then
    the cluster stopped. ``stop`` fails the file system first, on which a restarted MDS
    respawns under a new process id; none of the cluster's daemons may outlive ``stop``."""
    cluster = CephCluster(tmp_path / "ceph")
    cluster.start()
    try:
        cluster.kill_daemon("mds.a")
        cluster.restart_daemon("mds.a")
        assert sorted(cluster._leftovers()) == sorted(cluster.pids.values())
    finally:
        cluster.stop()
    assert cluster._leftovers() == []
