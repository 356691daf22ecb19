"""Host-side checks of the pyverbs provider's plumbing (no RDMA device needed).

pyverbs is not optional here: ``scripts/setup.sh`` installs python3-pyverbs, and these checks
need no device, so a missing pyverbs FAILS (at import) instead of skipping."""

from __future__ import annotations

import fcntl
import os

import pytest

from nfsrdma.transport.rdma.descriptors import create_with_descriptor
from nfsrdma.transport.rdma.provider import ProviderError, WcOpcode
from nfsrdma.transport.rdma.pyverbs_qp import wc_opcode


def test_new_channel_descriptor_is_found_and_made_non_blocking() -> None:
    """The one new descriptor of the wanted kind is found in /proc/self/fd and set
    O_NONBLOCK, so a spurious read fails with EAGAIN instead of blocking the loop."""
    files: list[object] = []

    def factory() -> int:
        files.append(open(os.devnull, "rb"))  # noqa: SIM115 - kept open on purpose
        return 1

    try:
        result, fd = create_with_descriptor(factory, os.devnull)
        assert result == 1
        assert os.readlink(f"/proc/self/fd/{fd}") == os.devnull
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        for f in files:
            f.close()  # type: ignore[attr-defined]


def test_ambiguous_or_missing_descriptor_is_an_error() -> None:
    with pytest.raises(ProviderError):
        create_with_descriptor(lambda: None, "/dev/infiniband/rdma_cm")
    opened: list[object] = []

    def two() -> None:
        opened.extend(open(os.devnull, "rb") for _ in range(2))  # noqa: SIM115

    try:
        with pytest.raises(ProviderError):
            create_with_descriptor(two, os.devnull)
    finally:
        for f in opened:
            f.close()  # type: ignore[attr-defined]


def test_unknown_completion_opcodes_map_by_direction() -> None:
    assert wc_opcode(0) is WcOpcode.SEND
    assert wc_opcode(2) is WcOpcode.RDMA_READ
    assert wc_opcode(129) is WcOpcode.RECV  # IBV_WC_RECV_RDMA_WITH_IMM
    assert wc_opcode(7) is WcOpcode.SEND
