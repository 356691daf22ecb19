"""``rdma://`` through fsspec: our server and the client on the in-process verbs provider (both
on fsspec's event loop, where the file system runs its coroutines), the transport given to the
file system as its ``connector``. fsspec's open, pipe and get test classes, READ data placed by
RDMA Writes, and pandas reading and writing ``rdma://`` URLs."""

from __future__ import annotations

import functools
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import fsspec.tests.abstract as abstract
import pandas as pd
import pytest
from fsspec.asyn import get_loop, sync

from nfsrdma.client.fsspec import RdmaFileSystem
from nfsrdma.transport.rdma.endpoint import connect_rdma

SERVER, CLIENT, PORT = "10.9.0.1", "10.9.0.2", 20049


class InprocRdma:
    """Our server on an in-process RDMA fabric, on fsspec's loop."""

    def __init__(self, export: Path) -> None:
        self.export = export
        self.server: Any = None
        self.connector: Callable[[], Any] | None = None

    async def start(self) -> None:
        from nfsrdma.server import NFSServer
        from nfsrdma.transport.rdma.inproc import InprocFabric

        fabric = InprocFabric()
        sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
        self.server = NFSServer(
            str(self.export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
            root_squash=False, lease_time=10, state_dir=str(self.export.parent / "state"),
        )  # fmt: skip
        await self.server.start()
        self.connector = functools.partial(connect_rdma, cdev, SERVER, PORT)

    def storage_options(self) -> dict[str, Any]:
        return {"connector": self.connector, "uid": 0, "gid": 0}


@pytest.fixture(scope="module")
def rdma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocRdma]:
    work = tmp_path_factory.mktemp("fsspec-rdma")
    (work / "export").mkdir()
    served = InprocRdma(work / "export")
    loop = get_loop()
    try:
        sync(loop, served.start, timeout=60)
    except Exception as e:
        pytest.fail(f"our server did not start on the in-process RDMA fabric: {e!r}")
    yield served
    fs = RdmaFileSystem(SERVER, PORT, **served.storage_options())
    fs.close()
    sync(loop, served.server.close, timeout=60)


@pytest.fixture
def rfs(rdma: InprocRdma) -> Any:
    return fsspec.filesystem("rdma", host=SERVER, port=PORT, **rdma.storage_options())


class RdmaFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, rfs: Any) -> Any:
        return rfs

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: Any) -> Iterator[str]:
        path = f"/abstract-{uuid.uuid4().hex[:8]}"
        fs.mkdir(path)
        yield path
        fs.rm(path, recursive=True)


class TestRdmaOpen(abstract.AbstractOpenTests, RdmaFixtures):  # type: ignore[misc]
    pass


class TestRdmaPipe(abstract.AbstractPipeTests, RdmaFixtures):  # type: ignore[misc]
    pass


class TestRdmaGet(abstract.AbstractGetTests, RdmaFixtures):  # type: ignore[misc]
    pass


def test_reads_land_through_rdma_writes(rfs: Any, rdma: InprocRdma) -> None:
    data = os.urandom(4 << 20)
    (rdma.export / "big").write_bytes(data)
    client = sync(rfs.loop, rfs._client)
    before = client.io_stats.placed_reads
    with rfs.open("/big", "rb", block_size=2 << 20) as f:
        f.seek(3 << 20)
        assert f.read(100) == data[3 << 20 : (3 << 20) + 100]
    assert rfs.cat_file("/big") == data
    assert client.io_stats.placed_reads > before  # the server wrote them into our buffers
    assert client.io_stats.copied_reads == 0
    rfs.pipe_file("/up", data)
    assert (rdma.export / "up").read_bytes() == data


def test_pandas_with_rdma_urls(rdma: InprocRdma) -> None:
    df = pd.DataFrame({"k": list(range(500)), "v": [i * 0.25 for i in range(500)]})
    url = f"rdma://{SERVER}/frames"
    opts = rdma.storage_options()
    df.to_csv(f"{url}/d.csv", index=False, storage_options=opts)
    pd.testing.assert_frame_equal(pd.read_csv(f"{url}/d.csv", storage_options=opts), df)
    df.to_parquet(f"{url}/d.parquet", storage_options=opts)
    pd.testing.assert_frame_equal(pd.read_parquet(f"{url}/d.parquet", storage_options=opts), df)
    assert (rdma.export / "frames" / "d.csv").read_text().startswith("k,v\n0,0.0\n")
