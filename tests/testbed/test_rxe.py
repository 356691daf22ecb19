"""Soft-RoCE in the guest: rxe0 exists and carries RDMA-CM connections in loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.testbed.helpers import BackgroundFactory, GuestEnv, rdma_listening, run
from nfsrdma.testbed.perftest import loopback_bw

pytestmark = pytest.mark.testbed

RPING_PORT = 7471
RPING_COUNT = 5


def test_rxe0_present(rxe: str) -> None:
    """rxe0 is an ACTIVE RoCE device with the user-space verbs and RDMA-CM devices."""
    links = run(["rdma", "link", "show"]).stdout
    assert f"link {rxe}/1 state ACTIVE" in links
    assert rxe in run(["ibv_devices"]).stdout
    assert Path("/dev/infiniband/rdma_cm").exists()
    assert list(Path("/dev/infiniband").glob("uverbs*"))


def test_rping_loopback(testbed: GuestEnv, rxe: str, background: BackgroundFactory) -> None:
    """rping server and client on rxe0 exchange RPING_COUNT pings through RDMA-CM."""
    args = ["-a", testbed.addr, "-p", str(RPING_PORT), "-C", str(RPING_COUNT), "-v"]
    server = background(["rping", "-s", *args], name="rping-server")
    server.wait_ready(lambda: rdma_listening(RPING_PORT), timeout=60)
    client = run(["rping", "-c", *args], timeout=120)
    assert client.stdout.count("ping data: rdma-ping-") == RPING_COUNT
    assert server.proc is not None
    assert server.proc.wait(60) == 0, server.log_tail()


@pytest.mark.parametrize("tool", ["ib_write_bw"])
def test_perftest_loopback(tool: str, rxe: str, artefacts: Path) -> None:
    """perftest bandwidth in loopback over rxe0 (RDMA-CM connection, RC QP): it completes and
    reports moving what it was asked to. The bandwidth figure itself is bench material
    (bench/testbed_baseline.py), not asserted here."""
    result = loopback_bw(tool, log_dir=artefacts, size=65536, iterations=200)
    assert result.msg_bytes == 65536
    assert result.iterations == 200


def test_rdmacm_binding_finds_the_device(testbed: GuestEnv, rxe: str) -> None:
    """The provider's librdmacm binding (ctypes, no pyverbs internals) binds an identifier to
    the guest address and reads the device it landed on; an address no device has is refused
    with a clear error instead of a crash."""
    from nfsrdma.transport.rdma.provider import ProviderError
    from nfsrdma.transport.rdma.pyverbs_provider import device_of

    assert device_of(testbed.addr) == rxe
    with pytest.raises(ProviderError, match="no RDMA device has address"):
        device_of("10.99.99.99")
