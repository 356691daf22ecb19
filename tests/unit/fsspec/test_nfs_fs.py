"""The fsspec file system over our server on TCP loopback: metadata, ranges, buffered files
with read-ahead, names, one shared client per server and identity, the entry points, and pandas."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import fsspec
import fsspec.core
import pandas as pd
import pytest
from fsspec.asyn import sync

import nfsrdma.client.fsspec
from nfsrdma.client.fs import NfsClient
from nfsrdma.client.fsspec import NfsFileSystem, RdmaFileSystem
from tests.unit.client.ourserver import REPO, OurServer
from tests.unit.fsspec.conftest import on_disk


@pytest.fixture
def fs(nfs_server: OurServer) -> Any:
    return fsspec.filesystem("nfs", host="127.0.0.1", port=nfs_server.port)


def client_of(fs: Any) -> NfsClient:
    return sync(fs.loop, fs._client)  # type: ignore[no-any-return]


# -- metadata and names -------------------------------------------------------------------------
def test_info_ls_and_the_predicates(fs: Any, nfs_server: OurServer, base: str) -> None:
    disk = on_disk(nfs_server, base)
    (disk / "f").write_bytes(b"12345")
    os.chmod(disk / "f", 0o640)
    os.utime(disk / "f", (1_600_000_000, 1_700_000_000))
    (disk / "d").mkdir()
    (disk / "ln").symlink_to("f")
    (disk / "dangling").symlink_to("nowhere")
    info = fs.info(f"{base}/f")
    assert info["name"] == f"{base}/f"
    assert (info["type"], info["size"], info["mode"], info["islink"]) == (
        "file",
        5,
        0o100640,
        False,
    )
    assert info["mtime"] == 1_700_000_000
    assert info["ino"] == (disk / "f").stat().st_ino
    assert fs.modified(f"{base}/f").timestamp() == 1_700_000_000
    assert fs.info(f"{base}/d")["type"] == "directory"
    assert fs.info(f"{base}/ln")["islink"] and fs.info(f"{base}/ln")["size"] == 5
    assert fs.info(f"{base}/dangling")["type"] == "other"
    assert fs.ls(base, detail=False) == [f"{base}/{n}" for n in ("d", "dangling", "f", "ln")]
    assert {d["name"]: d["type"] for d in fs.ls(base)}[f"{base}/ln"] == "file"
    assert fs.ls(f"{base}/f", detail=False) == [f"{base}/f"]
    assert fs.exists(f"{base}/f") and not fs.exists(f"{base}/nope")
    assert fs.isfile(f"{base}/f") and not fs.isfile(f"{base}/d")
    assert fs.isdir(f"{base}/d") and not fs.isdir(f"{base}/f")
    with pytest.raises(FileNotFoundError):
        fs.info(f"{base}/nope")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{base}/nope")


def test_glob_find_walk_and_du(fs: Any, nfs_server: OurServer, base: str) -> None:
    disk = on_disk(nfs_server, base)
    (disk / "a" / "b").mkdir(parents=True)
    (disk / "a" / "x.csv").write_bytes(b"1")
    (disk / "a" / "b" / "y.csv").write_bytes(b"22")
    (disk / "z.txt").write_bytes(b"333")
    assert fs.glob(f"{base}/**/*.csv") == [f"{base}/a/b/y.csv", f"{base}/a/x.csv"]
    assert fs.find(base) == [f"{base}/a/b/y.csv", f"{base}/a/x.csv", f"{base}/z.txt"]
    walked = {root: (sorted(dirs), sorted(files)) for root, dirs, files in fs.walk(base)}
    assert walked == {
        base: (["a"], ["z.txt"]),
        f"{base}/a": (["b"], ["x.csv"]),
        f"{base}/a/b": ([], ["y.csv"]),
    }
    assert fs.du(base) == 6


def test_mkdir_makedirs_rm_rmdir(fs: Any, nfs_server: OurServer, base: str) -> None:
    disk = on_disk(nfs_server, base)
    fs.mkdir(f"{base}/p/q/r")  # create_parents
    assert (disk / "p" / "q" / "r").is_dir()
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{base}/p")
    with pytest.raises(FileNotFoundError):
        fs.mkdir(f"{base}/no/such", create_parents=False)
    fs.makedirs(f"{base}/p/q", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/p/q")
    fs.pipe({f"{base}/p/q/r/{i}": b"x" for i in range(40)})
    with pytest.raises(OSError):
        fs.rmdir(f"{base}/p/q/r")  # not empty
    fs.rm(f"{base}/p/q/r/0")
    assert not (disk / "p" / "q" / "r" / "0").exists()
    fs.rm(f"{base}/p", recursive=True)
    assert not (disk / "p").exists()
    fs.mkdir(f"{base}/empty")
    fs.rmdir(f"{base}/empty")
    assert list(disk.iterdir()) == []


def test_mv_is_a_rename_and_cp_copies(fs: Any, nfs_server: OurServer, base: str) -> None:
    disk = on_disk(nfs_server, base)
    (disk / "d").mkdir()
    (disk / "src").write_bytes(b"payload" * 1000)
    ino = (disk / "src").stat().st_ino
    fs.mv(f"{base}/src", f"{base}/dst")
    assert (disk / "dst").stat().st_ino == ino and not (disk / "src").exists()
    fs.mv(f"{base}/dst", f"{base}/d")  # into the directory
    assert (disk / "d" / "dst").stat().st_ino == ino
    fs.mv(f"{base}/d", f"{base}/e")  # a directory too
    assert (disk / "e" / "dst").stat().st_ino == ino
    fs.cp_file(f"{base}/e/dst", f"{base}/copy")
    assert (disk / "copy").read_bytes() == b"payload" * 1000
    assert (disk / "copy").stat().st_ino != ino
    fs.cp(f"{base}/e", f"{base}/e2", recursive=True)
    assert (disk / "e2" / "dst").read_bytes() == b"payload" * 1000


# -- data ------------------------------------------------------------------------------------------
def test_cat_file_ranges_and_pipe(fs: Any, nfs_server: OurServer, base: str) -> None:
    data = os.urandom(3 << 20)
    fs.pipe_file(f"{base}/r", data)
    assert on_disk(nfs_server, f"{base}/r").read_bytes() == data
    p = f"{base}/r"
    assert fs.cat_file(p) == data
    for start, end in [(0, 10), (5, None), (-100, None), (None, -7), (1 << 20, 2 << 20 | 5),
                       (len(data) - 3, len(data) + 100), (50, 40), (-5, -1)]:  # fmt: skip
        assert fs.cat_file(p, start, end) == data[start:end], (start, end)
    assert fs.cat_ranges([p, p], [0, 100], [4, 104]) == [data[:4], data[100:104]]
    with pytest.raises(FileExistsError):
        fs.pipe_file(p, b"new", mode="create")
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{base}/missing")
    with pytest.raises(IsADirectoryError):
        fs.cat_file(base)


def test_put_and_get(fs: Any, nfs_server: OurServer, base: str, tmp_path: Path) -> None:
    local = tmp_path / "up"
    (local / "sub").mkdir(parents=True)
    (local / "a.bin").write_bytes(os.urandom(20 << 20 | 3))  # several COPY_CHUNKs
    (local / "sub" / "b.txt").write_bytes(b"b")
    fs.put(str(local), f"{base}/up", recursive=True)
    remote = on_disk(nfs_server, f"{base}/up")
    assert (remote / "a.bin").read_bytes() == (local / "a.bin").read_bytes()
    assert (remote / "sub" / "b.txt").read_bytes() == b"b"
    fs.get(f"{base}/up", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "a.bin").read_bytes() == (local / "a.bin").read_bytes()
    assert (tmp_path / "down" / "sub" / "b.txt").read_bytes() == b"b"


def test_open_reads_at_random_through_the_read_ahead_cache(
    fs: Any, nfs_server: OurServer, base: str
) -> None:
    data = os.urandom(5 << 20)
    on_disk(nfs_server, f"{base}/big").write_bytes(data)
    with fs.open(f"{base}/big", "rb", block_size=1 << 20) as f:
        assert f.size == len(data)
        pieces = [f.read(1000) for _ in range(100)]  # 100 kB sequentially: one fetch
        assert b"".join(pieces) == data[:100_000]
        assert f.cache.miss_count == 1
        for off in (4 << 20, 123, (5 << 20) - 10, 2_000_000):
            f.seek(off)
            assert f.read(20_000) == data[off : off + 20_000]
        f.seek(-5, os.SEEK_END)
        assert f.read() == data[-5:]
        assert f.readline() == b""
    # Text mode on top; newline="" keeps a random \r as it is (universal newlines would make
    # it \n, and the comparison fail for about one run in twenty-five).
    with fs.open(f"{base}/big", "r", encoding="latin-1", newline="") as t:
        assert t.read(10) == data[:10].decode("latin-1")
    with pytest.raises(FileNotFoundError):
        fs.open(f"{base}/missing", "rb")


def test_open_writes_are_buffered_until_flush_or_close(
    fs: Any, nfs_server: OurServer, base: str
) -> None:
    disk = on_disk(nfs_server, f"{base}/w")
    f = fs.open(f"{base}/w", "wb", block_size=1 << 20)
    assert disk.exists() and disk.stat().st_size == 0  # made at open
    f.write(b"a" * 1000)
    assert disk.stat().st_size == 0  # buffered
    f.write(b"b" * (1 << 20))  # past the block size: sent
    assert disk.stat().st_size == 1000 + (1 << 20)
    f.write(b"tail")
    assert disk.stat().st_size == 1000 + (1 << 20)
    f.close()
    assert disk.read_bytes() == b"a" * 1000 + b"b" * (1 << 20) + b"tail"
    with fs.open(f"{base}/w", "ab") as f:
        f.write(b"+more")
    assert disk.read_bytes().endswith(b"tail+more")
    with fs.open(f"{base}/deep/new/t.txt", "w") as t:  # parents made
        t.write("text\n")
    assert on_disk(nfs_server, f"{base}/deep/new/t.txt").read_text() == "text\n"
    with pytest.raises(FileExistsError):
        fs.open(f"{base}/w", "xb")


def test_a_file_collected_on_the_loop_thread_is_closed(
    fs: Any, nfs_server: OurServer, base: str
) -> None:
    """pyarrow and friends drop files unclosed; the garbage collector may run on fsspec's loop
    thread, where close() cannot wait for the loop: the CLOSE is scheduled there instead."""
    on_disk(nfs_server, f"{base}/f").write_bytes(b"x")
    held = [fs.open(f"{base}/f", "rb")]
    nfs = held[0]._nfs
    assert nfs is not None and not nfs.closed

    async def drop() -> None:
        held.clear()
        gc.collect()
        await asyncio.gather(*nfsrdma.client.fsspec._closing)

    sync(fs.loop, drop)
    assert nfs.closed


# -- URLs, entry points, the shared client --------------------------------------------------------
def test_urls(nfs_server: OurServer) -> None:
    url = f"nfs://127.0.0.1:{nfs_server.port}/some/dir/"
    fs, path = fsspec.core.url_to_fs(url)
    assert isinstance(fs, NfsFileSystem) and (fs.host, fs.port) == ("127.0.0.1", nfs_server.port)
    assert path == "/some/dir"
    assert fs.unstrip_protocol(path) == f"nfs://127.0.0.1:{nfs_server.port}/some/dir"
    # fsspec splits URLs at "::" (chained file systems): IPv6 addresses are written out in full.
    rfs, rpath = fsspec.core.url_to_fs("rdma://[fd00:0:0:0:0:0:0:1]/x/../y")
    assert isinstance(rfs, RdmaFileSystem) and (rfs.port, rpath) == (20049, "/y")
    assert rfs.host == "fd00:0:0:0:0:0:0:1"
    assert rfs.unstrip_protocol("/y") == "rdma://[fd00:0:0:0:0:0:0:1]:20049/y"
    assert fsspec.filesystem("rdma", host="::1").unstrip_protocol("/") == "rdma://[::1]:20049/"


def test_entry_points_register_both_schemes(tmp_path: Path) -> None:
    """pip writes ``[project.entry-points."fsspec.specs"]`` into the installed distribution's
    entry_points.txt; a distribution made here from the same table is what a fresh fsspec
    import (in a child process, nothing registered by hand) finds."""
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    specs = table["fsspec.specs"]
    assert specs == {
        "nfs": "nfsrdma.client.fsspec:NfsFileSystem",
        "rdma": "nfsrdma.client.fsspec:RdmaFileSystem",
    }
    dist = tmp_path / "nfsrdma_entry_points-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nfsrdma-entry-points\nVersion: 0\n"
    )
    lines = ["[fsspec.specs]", *(f"{k} = {v}" for k, v in specs.items())]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    probe = (
        "import fsspec\n"
        "for p in ('nfs', 'rdma'):\n"
        "    c = fsspec.get_filesystem_class(p)\n"
        "    print(p, c.__module__ + ':' + c.__name__, c.protocol[0])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [
        "nfs nfsrdma.client.fsspec:NfsFileSystem nfs",
        "rdma nfsrdma.client.fsspec:RdmaFileSystem rdma",
    ]


def test_one_client_per_server_and_identity(nfs_server: OurServer, base: str) -> None:
    a = NfsFileSystem("127.0.0.1", nfs_server.port, uid=0, gid=0, skip_instance_cache=True)
    b = NfsFileSystem(
        "127.0.0.1", nfs_server.port, uid=0, gid=0, block_size=1 << 16, skip_instance_cache=True
    )
    other = NfsFileSystem("127.0.0.1", nfs_server.port, uid=1000, gid=1000)
    try:
        assert a is not b
        assert client_of(a) is client_of(b)
        assert client_of(other) is not client_of(a)
        first = client_of(a)
        a.close()  # the shared client goes: its session is closed ...
        with pytest.raises(OSError):
            sync(a.loop, first.stat, "/")
        assert b.exists(base)  # ... and the next use connects again
        assert client_of(a) is client_of(b) is not first
    finally:
        other.close()


# -- pandas -----------------------------------------------------------------------------------------
def test_pandas_round_trip(nfs_server: OurServer, base: str) -> None:
    df = pd.DataFrame({"n": range(1000), "s": [f"row {i}" for i in range(1000)], "x": 0.5})
    url = f"nfs://127.0.0.1:{nfs_server.port}{base}"
    # pandas hands every scheme urllib knows (nfs:// among them) to urllib for CSV: open it
    # with fsspec. Parquet goes through fsspec by the URL itself.
    with fsspec.open(f"{url}/data.csv", "w") as f:
        df.to_csv(f, index=False)
    with fsspec.open(f"{url}/data.csv", "r") as f:
        pd.testing.assert_frame_equal(pd.read_csv(f), df)
    assert on_disk(nfs_server, f"{base}/data.csv").read_text().startswith("n,s,x\n0,row 0,0.5\n")
    df.to_parquet(f"{url}/data.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(f"{url}/data.parquet"), df)
    pd.testing.assert_frame_equal(pd.read_parquet(f"{url}/data.parquet", columns=["s"]), df[["s"]])


async def test_on_the_callers_loop(nfs_server: OurServer, base: str) -> None:
    fs = NfsFileSystem("127.0.0.1", nfs_server.port, asynchronous=True, skip_instance_cache=True)
    try:
        await fs._pipe_file(f"{base}/a", b"async bytes")
        assert await fs._cat_file(f"{base}/a", start=6) == b"bytes"
        assert [d["name"] for d in await fs._ls(base)] == [f"{base}/a"]
        assert on_disk(nfs_server, f"{base}/a").read_bytes() == b"async bytes"
    finally:
        await fs._close()
