"""``nfsrdma bench`` against our server on loopback: latency percentiles per small operation
and per NFSv4.1 operation, and the PNG chart of ``--plot``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nfsrdma.cli import main
from nfsrdma.server import NFSServer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


async def test_bench_prints_percentiles_and_writes_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    chart = tmp_path / "bench.png"
    async with NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None, root_squash=False,
        state_dir=str(tmp_path / "state"),
    ) as server:  # fmt: skip
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        argv = ["bench", url, "--uid", "0", "--gid", "0", "--size", "1", "--block", "1"]
        argv += ["--files", "8", "--concurrency", "4"]
        rc = await asyncio.to_thread(main, [*argv, "--plot", str(chart)])
        assert rc == 0
        text = capsys.readouterr().out
        rc = await asyncio.to_thread(main, [*argv, "--json"])
        assert rc == 0
        result = json.loads(capsys.readouterr().out)
    data = chart.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    assert "p50" in text and "p99" in text
    nfs_lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert int(nfs_lines["WRITE"][1]) >= 1 and int(nfs_lines["READ"][1]) >= 1
    assert int(nfs_lines["OPEN"][1]) >= 8
    assert result["ops"]["stat"]["ops"] == 8
    nfs_ops = result["nfs_ops"]
    assert nfs_ops["OPEN"]["count"] >= 8 and nfs_ops["REMOVE"]["count"] >= 8
    assert 0 < nfs_ops["GETATTR"]["p50_ms"] <= nfs_ops["GETATTR"]["p99_ms"]
    assert "samples" not in result
