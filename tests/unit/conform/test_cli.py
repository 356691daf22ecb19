"""``nfsrdma conform`` from the command line: exit status (0 with no FAIL, 1 with one, 2 for a
usage error), --list/--only/--exclude, --json and --junit, the failure report; and
docs/conform.md's list of checks is the one the code generates."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nfsrdma.cli import main
from nfsrdma.conform import report
from nfsrdma.conform.registry import all_checks

from .servers import served
from .test_harness import tag_dropped

REPO = Path(__file__).resolve().parents[3]


async def conform(*argv: str) -> tuple[int, str, str]:
    """The command in a child process (the server runs in this test's event loop)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nfsrdma", "conform", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_exit_0_when_nothing_fails_with_json_and_junit(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    js, ju = tmp_path / "r.json", tmp_path / "r.xml"
    async with served(export) as (h, _):
        rc, out, err = await conform(
            str(h.url), "--only", "SS-6*", "--json", str(js), "--junit", str(ju)
        )
    assert rc == 0, out + err
    data = json.loads(js.read_text())
    ids = [c["id"] for c in data["checks"]]
    assert ids == [c.id for c in all_checks() if c.id.startswith("SS-6")]
    assert {c["result"] for c in data["checks"]} == {"PASS"}
    assert data["totals"]["PASS"] == len(ids)
    suite = ET.parse(ju).getroot()
    assert suite.get("tests") == str(len(ids)) and suite.get("failures") == "0"
    assert f"[{len(ids):3d}/{len(ids)}] PASS" in out  # progress
    assert f"checks={len(ids)} pass={len(ids)} fail=0" in out  # summary


async def test_exit_1_when_a_check_fails_and_the_exchange_is_shown(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    ju, trace = tmp_path / "r.xml", tmp_path / "r.pcap"
    async with served(export, mutation=tag_dropped) as (h, _):
        rc, out, err = await conform(
            str(h.url), "--only", "CONF-COMP", "--junit", str(ju), "--trace", str(trace)
        )
    assert rc == 1, out + err
    assert "FAIL CONF-COMP-2: COMPOUND tag echoed" in out
    assert "expected: the tag b'nfsrdma-conform tag \\xc3\\xa9'" in out
    assert "    > PUTROOTFH" in out and "    < status NFS4ERR_OP_NOT_IN_SESSION" in out
    assert "fail=1" in out
    suite = ET.parse(ju).getroot()
    assert suite.get("failures") == "1"
    # The failing check's messages, as TCP in a pcap file that tshark decodes as NFS.
    decoded = tshark(trace)
    calls = [line for line in decoded.splitlines() if "V4 Call" in line]
    assert calls and all("PUTROOTFH" in line for line in calls), decoded
    assert "V4 Reply (Call In" in decoded


def tshark(pcap: Path, *args: str) -> str:
    """tshark's one-line summaries of ``pcap`` (tshark is installed by scripts/setup.sh)."""
    import subprocess

    exe = shutil.which("tshark")
    assert exe, "tshark is missing (apt-get install tshark)"
    done = subprocess.run(
        [exe, "-r", str(pcap), *args], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


def test_list_only_exclude(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--list", "--only", "SS-7*", "--exclude", "SS-7.4"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert ids == ["SS-7.1", "SS-7.2", "SS-7.3", "SS-7.5"]
    assert main(["conform", "--list", "--only", "rfc8881-ops"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert ids and all(i.startswith("CONF-OPS-") for i in ids)
    assert main(["conform", "--list", "--transport-only"]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    want = [c.id for c in all_checks() if c.group in ("rfc8166", "rfc8797")]
    assert ids == want and len(ids) >= 20


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform"]) == 2
    assert main(["conform", "http://host/x"]) == 2
    assert main(["conform", "nfs://127.0.0.1/", "--only", "NO-SUCH-CHECK"]) == 2
    assert "no check matches" in capsys.readouterr().err


def test_checks_have_unique_ids_docstrings_and_rfc_sections() -> None:
    checks = all_checks()
    assert len({c.id for c in checks}) == len(checks)
    assert all(c.description and c.rfc.startswith("RFC ") for c in checks)


def test_docs_list_of_checks_is_current() -> None:
    doc = (REPO / "docs" / "conform.md").read_text()
    want = report.markdown(all_checks())
    assert want in doc, "regenerate: nfsrdma conform --list --markdown (see docs/conform.md)"
