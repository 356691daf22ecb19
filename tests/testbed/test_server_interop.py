"""The Linux NFS client against our server and against knfsd, same workload, same results
(issue 4 over TCP; issue 5 over RDMA, mountstats showing ``xprt: rdma``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from nfsrdma.testbed.helpers import Knfsd, MountFactory, Proto, sha256_file
from nfsrdma.testbed.ours import OurServer, our_server
from tests.testbed.workload import Result, run_workload

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def ours(knfsd: Knfsd) -> Iterator[OurServer]:
    # Without delegations: under one (a write delegation for a file the workload opens again)
    # the Linux client keeps its POSIX locks locally (RFC 8881 section 10.4), so no blocked
    # LOCK reaches the server and CB_NOTIFY_LOCK, checked below, would never be needed.
    # Delegations with the Linux client are tested in test_delegations.py.
    with our_server(extra=("--no-delegations",)) as srv:
        yield srv


def _save(name: str, result: Result) -> None:
    from nfsrdma.testbed.helpers import out_dir

    (out_dir() / f"workload-{name}.json").write_text(json.dumps(asdict(result), indent=1))


@pytest.mark.parametrize("proto", ["tcp", "rdma"])
def test_linux_client_workload_same_as_knfsd(
    proto: Proto, knfsd: Knfsd, ours: OurServer, nfs_mount: MountFactory
) -> None:
    """SS-*/UL-9: the Linux client (vers=4.1) runs the workload on knfsd and on our server
    over the same transport; listings, checksums and lock behaviour are identical."""
    with nfs_mount(knfsd.server(proto)) as m:
        reference = run_workload(m.mountpoint)
    _save(f"knfsd-{proto}", reference)
    with nfs_mount(ours.server(proto)) as m:
        assert m.stats().xprt == proto
        result = run_workload(m.mountpoint)
        on_server = ours.export / "workload" / "size8388608"
        assert sha256_file(on_server) == result.checksums["size8388608"]
    _save(f"ours-{proto}", result)
    assert result.lock_conflict_seen and result.flock_conflict_seen
    assert result.locked_records == {"fcntl": 80, "flock": 80}
    assert result.comparable() == reference.comparable()
    # The blocked lock-owners were woken by CB_NOTIFY_LOCK on the back channel, which over
    # RDMA shares the client's connection (RFC 8167, UL-22).
    log = ours.proc.log.read_text()
    notified = rf"callback OP_CB_SEQUENCE\+OP_CB_NOTIFY_LOCK to client \S+ over {proto}: NFS4_OK"
    assert re.search(notified, log), "no CB_NOTIFY_LOCK reached the client"
