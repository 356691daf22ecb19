"""Statistics of a running server after real COMPOUNDs, over TCP on loopback and over
RPC-over-RDMA (in-process verbs): ``nfsrdma stats`` over the admin socket (JSON and table),
the Prometheus endpoint scraped over loopback HTTP, and the client's own figures."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import nfsrdma.client as nc
from nfsrdma.cli import main
from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaConnection, connect_rdma
from nfsrdma.transport.rdma.inproc import InprocDevice, InprocFabric
from tests.unit.rdma.faults import BAD_HEADERS, expect_rdma_error

SERVER, CLIENT, RDMA_PORT = "10.9.0.1", "10.9.0.2", 20049


@asynccontextmanager
async def rdma_client(device: InprocDevice) -> AsyncIterator[NfsClient]:
    async def connect() -> Connection:
        return await connect_rdma(device, SERVER, RDMA_PORT)

    session = ClientSession(connect, SessionOptions(uid=0, gid=0, rsize=64 << 10, wsize=64 << 10))
    await session.start()
    try:
        fs = NfsClient(session, parse_url(f"rdma://{SERVER}/"))
        await fs.mount()
        yield fs
        await fs.aclose()
    finally:
        await session.close()


async def _io(fs: NfsClient, name: str) -> None:
    data = os.urandom(300 << 10)  # several READs and WRITEs, data by chunks over RDMA
    await fs.write_bytes(name, data)
    assert await fs.read_bytes(name) == data
    with pytest.raises(FileNotFoundError):
        await fs.stat(f"{name}.missing")
    await fs.rename(name, f"{name}.moved")  # its reply is kept in the reply cache


def _stats_cli(state: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["stats", "--state-dir", state, *extra]) == 0
    return capsys.readouterr().out


def _scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.headers["Content-Type"], r.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_stats_after_compounds_over_tcp_and_rdma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, state = tmp_path / "export", str(tmp_path / "state")
    export.mkdir()
    fabric = InprocFabric()
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=RDMA_PORT,
        rdma_device=fabric.device(SERVER), root_squash=False, state_dir=state,
        admin_socket=True, metrics=("127.0.0.1", 0),
    )  # fmt: skip
    await server.start()
    try:
        url = f"nfs://127.0.0.1:{server.tcp_port}/"
        async with nc.connect(url, uid=0, gid=0, rsize=64 << 10, wsize=64 << 10) as fs:
            await _io(fs, "over-tcp")
            mine = fs.stats()
            async with rdma_client(fabric.device(CLIENT)) as rfs:
                await _io(rfs, "over-rdma")
                rpc = rfs.session.rpc
                assert rpc is not None and isinstance(rpc.conn, RdmaConnection)
                for message, err, _ in BAD_HEADERS[:2]:  # one ERR_VERS, one ERR_CHUNK
                    assert err in await expect_rdma_error(rpc, rpc.conn, message)

                snap: dict[str, Any] = json.loads(
                    await asyncio.to_thread(_stats_cli, state, capsys, "--json")
                )
                text = await asyncio.to_thread(_stats_cli, state, capsys)
                assert server.stats.metrics is not None
                ctype, exposition = await asyncio.to_thread(_scrape, server.stats.metrics.port)
    finally:
        await server.close()

    # The client library's own figures.
    assert mine["WRITE"]["count"] >= 5 and mine["READ"]["count"] >= 5
    assert mine["LOOKUP"]["errors"] == {"NFS4ERR_NOENT": 1}
    assert 0 < mine["READ"]["p50_ms"] <= mine["READ"]["p99_ms"]

    # nfsrdma stats --json: operations per transport, as sent.
    for kind in ("tcp", "rdma"):
        t = snap["transports"][kind]
        assert t["connections"] == 1
        assert t["compounds"] > 0
        ops = t["ops"]
        for name in ("SEQUENCE", "OPEN", "WRITE", "READ", "CLOSE", "COMMIT"):
            assert ops[name]["count"] > 0, (kind, name)
        assert ops["WRITE"]["count"] >= 5 and ops["READ"]["count"] >= 5
        assert ops["LOOKUP"]["errors"] == {"NFS4ERR_NOENT": 1}
        assert ops["READ"]["errors"] == {}
        assert 0 < ops["READ"]["p50_ms"] <= ops["READ"]["p99_ms"]
    assert snap["transports"]["tcp"]["ops"]["READ"]["count"] == mine["READ"]["count"]
    rdma = snap["rdma"]
    assert rdma["connections"] == 1
    assert rdma["credits_granted"] == 32
    c = rdma["counters"]
    assert c["calls_inline"] > 0 and c["replies_inline"] > 0
    assert c["read_chunks_received"] >= 5  # WRITE data pulled by RDMA Reads
    assert c["write_chunks_filled"] >= 5  # READ data pushed by RDMA Writes
    assert c["write_chunks_offered"] >= c["write_chunks_filled"]
    assert c["rdma_reads"] >= 5 and c["rdma_writes"] >= 5
    assert c["rdma_error_vers_sent"] == 1 and c["rdma_error_chunk_sent"] == 1
    sessions = snap["sessions"]
    assert sessions["clients"] == 2 and sessions["sessions"] == 2
    assert sessions["slots"] > 0 and sessions["slots_in_use"] == 0
    assert sessions["reply_cache_bytes"] > 0  # the last RENAME's reply

    # The table: one line per operation with its figures.
    assert "tcp: 1 connections" in text and "rdma: 1 connections" in text
    read_lines = [line.split() for line in text.splitlines() if line.split()[:1] == ["READ"]]
    assert len(read_lines) == 2 and all(int(line[1]) >= 5 for line in read_lines)
    assert "LOOKUP NFS4ERR_NOENT 1" in text
    assert "RPC-over-RDMA: 1 connections" in text
    assert "RDMA_ERROR sent  ERR_VERS 1  ERR_CHUNK 1" in text

    # Prometheus exposition, parsed.
    assert ctype.startswith("text/plain; version=")
    s = _samples(exposition)
    for kind in ("tcp", "rdma"):
        n = s[("nfsrdma_operations_total", (("op", "READ"), ("transport", kind)))]
        assert n == snap["transports"][kind]["ops"]["READ"]["count"]
        labels = (("le", "+Inf"), ("op", "READ"), ("transport", kind))
        assert s[("nfsrdma_operation_latency_seconds_bucket", labels)] == n
        assert s[("nfsrdma_operation_latency_seconds_count", labels[1:])] == n
        assert s[("nfsrdma_operation_latency_seconds_sum", labels[1:])] > 0
        err = (("op", "LOOKUP"), ("status", "NFS4ERR_NOENT"), ("transport", kind))
        assert s[("nfsrdma_operation_errors_total", err)] == 1
    assert s[("nfsrdma_rdma_credits_granted", ())] == 32
    assert s[("nfsrdma_rdma_chunks_total", (("chunk", "read"), ("use", "received")))] >= 5
    assert s[("nfsrdma_rdma_messages_total", (("direction", "call"), ("placement", "inline")))] > 0
    assert s[("nfsrdma_rdma_errors_sent_total", (("kind", "ERR_CHUNK"),))] == 1
    assert s[("nfsrdma_rdma_errors_sent_total", (("kind", "ERR_VERS"),))] == 1
    assert s[("nfsrdma_sessions", ())] == 2


async def test_no_admin_socket_unless_asked(tmp_path: Path) -> None:
    export, state = tmp_path / "export", tmp_path / "state"
    export.mkdir()
    async with NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None, state_dir=str(state)
    ):
        assert not (state / "admin.sock").exists()
    assert main(["stats", "--state-dir", str(state)]) == 1


async def test_server_serves_without_an_admin_socket_it_cannot_make(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    export, state = tmp_path / "export", tmp_path / ("d" * 110) / "state"  # too long for AF_UNIX
    export.mkdir()
    async with NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None, state_dir=str(state),
        root_squash=False, admin_socket=True,
    ) as server:  # fmt: skip
        assert server.stats.admin is None
        async with nc.connect(f"nfs://127.0.0.1:{server.tcp_port}/", uid=0, gid=0) as fs:
            await fs.write_bytes("f", b"still serving")
        assert server.stats.snapshot()["transports"]["tcp"]["ops"]["WRITE"]["count"] == 1
    assert "no admin socket" in caplog.text
