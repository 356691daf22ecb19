"""The host sees what happens in the guest: one VM boot (no knfsd) running a test file whose
tests fail on purpose; ``nfsrdma testbed run`` must exit like the guest's pytest did, with the
output streamed and the junit XML and files left in the out directory."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nfsrdma.testbed.constants import ENV_ADDR, JUNIT_FILE
from nfsrdma.testbed.vm import checkout_dir

CASE = "tests/testbed/deliberate_failure.py"


@pytest.mark.skipif(ENV_ADDR in os.environ, reason="already inside the test-bed VM")
def test_failure_in_guest_fails_on_host(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "nfsrdma", "testbed", "run", "--out", str(out), "--timeout", "600",
        "--", sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "testbed", CASE,
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=checkout_dir(), capture_output=True, text=True, timeout=900, check=False
    )
    log = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    # pytest's exit code 1 (tests failed) comes through vng and `nfsrdma testbed run`.
    assert proc.returncode == 1, log
    # The guest's pytest output is streamed to the host's stdout.
    assert "2 failed, 1 passed" in proc.stdout, log
    assert "deliberate failure inside the guest" in proc.stdout, log
    assert "skipped inside the test bed, which counts as a failure" in proc.stdout, log
    # Results written in the guest are on the host.
    assert (out / "deliberate-failure-ran.txt").read_text().strip() == "10.77.0.1"
    suite = ET.parse(out / JUNIT_FILE).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    assert (suite.get("tests"), suite.get("failures")) == ("3", "2"), ET.tostring(suite)
    assert (out / "kernel.log").stat().st_size > 0
