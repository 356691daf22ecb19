"""Deliberate failures, run ONLY by tests/vmhost/test_guest_failure.py (the name does not match
``test_*.py``, so the normal test-bed run never collects this file). It proves that a
failure inside the guest reaches the host's exit code, and that a skip inside the test bed
counts as a failure."""

from __future__ import annotations

import os

import pytest

from nfsrdma.testbed.helpers import GuestEnv

pytestmark = pytest.mark.testbed

MARKER = "deliberate-failure-ran.txt"


def test_passes_and_leaves_a_file(testbed: GuestEnv) -> None:
    (testbed.out / MARKER).write_text(f"{os.environ['TESTBED_ADDR']}\n")


def test_fails_on_purpose() -> None:
    pytest.fail("deliberate failure inside the guest")


def test_skip_counts_as_failure() -> None:
    pytest.skip("a skip inside the test bed must fail the run")
