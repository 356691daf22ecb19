"""The harness against a third-party server: NFS-Ganesha on the host over TCP (the VFS FSAL
as root, else the MEM FSAL). Its results are pinned: every check passes but those where
docs/conform.md explains, with the RFC text, why we believe Ganesha is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.client.url import parse_url
from nfsrdma.conform.harness import Harness
from nfsrdma.conform.registry import Result, all_checks
from nfsrdma.conform.runner import run_checks
from tests.unit.client import ganesha as g

# RFC 8881 16.2.3 (no result for the failing operation), 18.46.3 (REQ_TOO_BIG), 8.2.4 (a
# closed stateid accepted again).
GANESHA_DIFFERS = {"SS-3.1", "SS-3.3", "SS-3.4", "SS-3.5", "SS-21.2", "CONF-OPS-7"}


async def test_ganesha_over_tcp(tmp_path: Path) -> None:
    why = g.available()
    if why is not None:
        pytest.fail(f"{why}; scripts/setup.sh installs it")
    server = g.Ganesha(tmp_path, g.free_port(), "/export", tmp_path / "export")
    try:
        server.start()
    except RuntimeError as e:
        pytest.fail(f"Ganesha did not start: {e}")
    try:
        h = Harness(parse_url(f"nfs://127.0.0.1:{server.port}/export"), timeout=10)
        outcomes = await run_checks(h, all_checks(), limit=60)
    finally:
        server.stop()
    by = {o.check.id: o.result for o in outcomes}
    failed = {i for i, r in by.items() if r is Result.FAIL}
    assert failed == GANESHA_DIFFERS, {
        o.check.id: o.detail for o in outcomes if o.check.id in failed
    }
    skipped = {i for i, r in by.items() if r is Result.SKIP}
    rdma_only = {c.id for c in all_checks() if c.transports == ("rdma",)}
    assert skipped - {"SS-30.2"} == rdma_only  # SS-30.2: Ganesha's lease is 60 s
