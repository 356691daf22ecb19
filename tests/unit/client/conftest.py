"""Fixtures for the client tests: an NFSv4.1 server on the host, started once per test session
(``nfs_server``: NFS-Ganesha, a third-party server, and our own ``nfsrdma.server``, each in a
child process), and a fresh directory name for each test.

Neither server may be missing: ``scripts/setup.sh`` installs NFS-Ganesha with both FSALs, and our
own server is the thing under test. A server that is not installed or does not start FAILS the
tests that use it (a skip would let a broken set-up or a broken server pass silently)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.testbed.ceph_cluster import CephCluster
from tests.unit.client import ganesha as g
from tests.unit.client.ourserver import OurServer

Server = g.Ganesha | OurServer


@pytest.fixture(scope="session", params=["ganesha", "ours", "ours-cephfs"])
def nfs_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    work = tmp_path_factory.mktemp(request.param)
    server: Server
    if request.param == "ours-cephfs":
        cluster: CephCluster = request.getfixturevalue("ceph_cluster")
        server = OurServer(work, g.free_port(), None, ceph_conf=cluster.conf)
    elif request.param == "ganesha":
        why = g.available()
        if why is not None:
            pytest.fail(f"{why}; scripts/setup.sh installs it")
        server = g.Ganesha(work, g.free_port(), "/export", work / "export")
    else:
        server = OurServer(work, g.free_port(), work / "export")
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(f"{request.param} did not start: {e}")
    yield server
    server.stop()


@pytest.fixture
def testdir(request: pytest.FixtureRequest) -> str:
    """A directory name for this test, to be created on the server by the test."""
    return "t-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:80]


@pytest.fixture
def server_path(nfs_server: Server, testdir: str) -> Path | None:
    """Where the test's directory lives on the server's disk (None for in-memory Ganesha)."""
    return None if nfs_server.export_dir is None else nfs_server.export_dir / testdir
