"""``nfsrdma stats`` and the Prometheus endpoint show what the Linux client sent to our server,
over TCP and over RPC-over-RDMA (soft-RoCE): READ, WRITE and OPEN counted per transport, and
the RPC-over-RDMA counters moved (WRITE data pulled by RDMA Reads from Read chunks, READ data
pushed by RDMA Writes into Write chunks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nfsrdma.testbed.helpers import MountFactory, drop_caches
from nfsrdma.testbed.ours import our_server

pytestmark = pytest.mark.testbed

NAME = "stats"
STATE_DIR = f"/tmp/{NAME}-state"
METRICS = "127.0.0.1:9464"


def _nfsrdma_stats(*extra: str) -> str:
    argv = [sys.executable, "-m", "nfsrdma", "stats", "--state-dir", STATE_DIR, *extra]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


def _ops(snap: dict[str, Any], proto: str) -> dict[str, Any]:
    ops: dict[str, Any] = snap["transports"][proto]["ops"]
    return ops


def test_stats_show_the_linux_clients_operations(nfs_mount: MountFactory) -> None:
    data = os.urandom(512 << 10)
    with our_server(NAME, extra=("--metrics", METRICS)) as srv:
        assert json.loads(_nfsrdma_stats("--json"))["transports"]["rdma"]["ops"] == {}
        for proto in ("tcp", "rdma"):
            with nfs_mount(srv.server(proto)) as m:
                path = Path(m.mountpoint) / f"file-{proto}"
                path.write_bytes(data)
                drop_caches()
                assert path.read_bytes() == data
                assert (srv.export / f"file-{proto}").read_bytes() == data
                # The mount's client ID and session (umount destroys them).
                sessions = json.loads(_nfsrdma_stats("--json"))["sessions"]
                assert sessions["clients"] >= 1 and sessions["sessions"] >= 1, sessions
                assert sessions["slots"] > 0, sessions
        snap = json.loads(_nfsrdma_stats("--json"))
        table = _nfsrdma_stats()
        with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=60) as r:
            exposition = r.read().decode()

    for proto in ("tcp", "rdma"):
        ops = _ops(snap, proto)
        for name in ("SEQUENCE", "OPEN", "WRITE", "READ", "CLOSE", "GETATTR"):
            assert ops.get(name, {}).get("count", 0) > 0, (proto, name, sorted(ops))
        assert ops["WRITE"]["errors"] == {} and ops["READ"]["errors"] == {}
        assert 0 < ops["READ"]["p50_ms"] <= ops["READ"]["p99_ms"]
        assert snap["transports"][proto]["compounds"] > 0
    counters = snap["rdma"]["counters"]
    assert counters["calls_inline"] > 0 and counters["replies_inline"] > 0
    assert counters["read_chunks_received"] > 0 and counters["rdma_reads"] > 0
    assert counters["write_chunks_filled"] > 0 and counters["rdma_writes"] > 0
    assert counters.get("rdma_error_chunk_sent", 0) == 0
    assert counters.get("rdma_error_vers_sent", 0) == 0
    read_lines = [line.split() for line in table.splitlines() if line.split()[:1] == ["READ"]]
    assert len(read_lines) == 2, table
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }
    for proto in ("tcp", "rdma"):
        key = ("nfsrdma_operations_total", (("op", "READ"), ("transport", proto)))
        assert samples[key] >= _ops(snap, proto)["READ"]["count"] > 0
    key = ("nfsrdma_rdma_chunks_total", (("chunk", "read"), ("use", "received")))
    assert samples[key] >= counters["read_chunks_received"] > 0
