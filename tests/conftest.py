"""Test-suite wide set-up: ``async def`` tests run on a fresh event loop each.

Async fixtures are not used; tests enter async context managers themselves."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from nfsrdma.testbed.ceph_cluster import CephCluster, CephClusterError

if TYPE_CHECKING:
    from tests.kdc import Kdc


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    funcargs = pyfuncitem.funcargs
    args = {name: funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    with asyncio.Runner() as runner:
        runner.run(pyfuncitem.obj(**args))
    return True


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephCluster]:
    """One single-node Ceph cluster with a CephFS for the whole session (about 8 s to start).

    ``scripts/setup.sh test`` installs the Ceph daemons; a cluster that does not come up FAILS
    the tests that use it."""
    cluster = CephCluster(tmp_path_factory.mktemp("ceph"))
    try:
        cluster.start()
    except (CephClusterError, OSError, subprocess.SubprocessError) as e:
        pytest.fail(f"the test Ceph cluster did not start: {e}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def kdc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kdc]:
    """A real MIT KDC on 127.0.0.1 with its own realm (tests/kdc.py), started once per session;
    this process's Kerberos library is pointed at its krb5.conf. Fails if it cannot start."""
    from tests.kdc import remove, start_kdc

    kdc = start_kdc(tmp_path_factory.mktemp("kdc"))
    saved = {k: os.environ.get(k) for k in ("KRB5_CONFIG", "KRB5_KDC_PROFILE", "KRB5CCNAME")}
    for k in saved:
        os.environ[k] = kdc.env[k]
    try:
        yield kdc
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        remove(kdc)
