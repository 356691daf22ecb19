"""The client's command line against NFS-Ganesha and our own server: ls, stat, cat, get, put, cp, rm, mkdir, mv,
bench, with --json where it fits and a progress bar for large transfers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nfsrdma.client.cli import Progress, main

from .conftest import Server


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_round_trip(
    nfs_server: Server, testdir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = f"{nfs_server.url()}/{testdir}"
    ids = ["--uid", "0", "--gid", "0"]
    assert run(capsys, "mkdir", *ids, "-p", f"{base}/sub/deeper")[0] == 0
    local = tmp_path / "in.bin"
    data = os.urandom(min(5 << 20, nfs_server.max_file - 1))
    local.write_bytes(data)
    rc, out, err = run(capsys, "put", *ids, "--json", "--progress", str(local), f"{base}/sub/")
    assert rc == 0
    put = json.loads(out)
    assert put["bytes"] == len(data) and put["to"].endswith(f"{testdir}/sub/in.bin")
    assert "100.0%" in err  # the progress bar reached the end
    rc, out, _ = run(capsys, "ls", *ids, "--json", f"{base}/sub")
    listing = {e["name"]: e for e in json.loads(out)}
    assert listing["in.bin"]["size"] == len(data) and listing["deeper"]["type"] == "NF4DIR"
    rc, out, _ = run(capsys, "ls", *ids, "-l", f"{base}/sub")
    assert "in.bin" in out and out.splitlines()[1].startswith("-rw")
    rc, out, _ = run(capsys, "stat", *ids, "--json", f"{base}/sub/in.bin")
    assert json.loads(out)["size"] == len(data)
    got = tmp_path / "out.bin"
    assert run(capsys, "get", *ids, "--no-progress", f"{base}/sub/in.bin", str(got))[0] == 0
    assert got.read_bytes() == data
    assert run(capsys, "cp", *ids, f"{base}/sub/in.bin", f"{base}/copy.bin")[0] == 0
    assert run(capsys, "mv", *ids, f"{base}/copy.bin", f"{base}/sub/deeper/")[0] == 0
    rc, out, _ = run(capsys, "ls", *ids, f"{base}/sub/deeper")
    assert out.split() == ["copy.bin"]
    small = tmp_path / "small.txt"
    small.write_bytes(b"hello cat\n")
    assert run(capsys, "cp", *ids, str(small), f"{base}/small.txt")[0] == 0
    rc, out, _ = run(capsys, "cat", *ids, f"{base}/small.txt")
    assert rc == 0 and out == "hello cat\n"
    rc, _, err = run(capsys, "rm", *ids, f"{base}/sub")
    assert rc == 1 and "directory" in err
    rc, _, err = run(capsys, "stat", *ids, f"{base}/nope")
    assert rc == 1 and "NFS4ERR_NOENT" in err
    assert run(capsys, "rm", *ids, "-r", f"{base}")[0] == 0
    assert run(capsys, "rm", *ids, "-f", f"{base}/gone")[0] == 0


def test_cli_bench_json(
    nfs_server: Server, testdir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = ["--uid", "0", "--gid", "0"]
    base = f"{nfs_server.url()}/{testdir}"
    assert run(capsys, "mkdir", *ids, base)[0] == 0
    rc, out, _ = run(
        capsys, "bench", *ids, "--json", "--size", "2", "--block", "1", "--files", "20", base
    )
    assert rc == 0  # the bench fails when a read returns fewer bytes than were written
    r = json.loads(out)
    # Speed figures are reported, not judged here (speed belongs in bench/); what is checked
    # is the work done: 2 MiB moved each way, 20 of each small operation.
    assert r["size"] == 2 << 20
    assert isinstance(r["write_mb_s"], float) and isinstance(r["read_mb_s"], float)
    assert set(r["ops"]) == {"create", "stat", "remove"}
    assert all(r["ops"][name]["ops"] == 20 for name in r["ops"])
    assert r["ops"]["stat"]["p99_ms"] >= r["ops"]["stat"]["p50_ms"]
    assert r["session"]["transport"] == "tcp"
    rc, out, _ = run(capsys, "ls", *ids, base)
    assert out == ""  # the scratch directory is gone


def test_progress_line() -> None:
    import io

    buf = io.StringIO()
    p = Progress(8 << 20, "file", True, out=buf)
    p.update(4 << 20)
    p.update(4 << 20)
    p.finish()
    assert "100.0%" in buf.getvalue() and "8.0 MiB" in buf.getvalue()
