"""Fixtures for the fsspec tests: our server in a child process on TCP loopback (a server that
does not start FAILS the tests), and ``nfs://`` registered with fsspec.

The package's ``fsspec.specs`` entry points are what registers the schemes once nfsrdma is
installed; this tree is not installed (the shared virtualenv's editable install is another
checkout), so the schemes are registered here by the same class paths, and
``test_entry_points`` checks the entry points themselves through ``importlib.metadata``."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from nfsrdma.client.fsspec import close_all
from tests.unit.client.ganesha import free_port
from tests.unit.client.ourserver import OurServer

fsspec.register_implementation("nfs", "nfsrdma.client.fsspec.NfsFileSystem", clobber=True)
fsspec.register_implementation("rdma", "nfsrdma.client.fsspec.RdmaFileSystem", clobber=True)


@pytest.fixture(scope="session")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OurServer]:
    work = tmp_path_factory.mktemp("fsspec-server")
    server = OurServer(work, free_port(), work / "export")
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(f"our server did not start: {e}")
    yield server
    close_all()  # the clients' sessions end before their server does
    server.stop()


@pytest.fixture
def base(request: pytest.FixtureRequest, nfs_server: OurServer) -> Iterator[str]:
    """A fresh directory on the server for this test, as a server path ("/t-NAME-...")."""
    name = "t-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60] + uuid.uuid4().hex[:6]
    (nfs_server.export_dir / name).mkdir()
    yield "/" + name


def on_disk(server: OurServer, path: str) -> Path:
    return server.export_dir / path.lstrip("/")
