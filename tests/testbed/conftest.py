"""Tests that run inside the test-bed guest (real kernel: rxe0, knfsd, the Linux NFS client).

Run them with ``make test-testbed``, i.e.
``nfsrdma testbed run --knfsd -- python -m pytest -p no:cacheprovider -m testbed tests/testbed``.

- Every test here gets the ``testbed`` marker.
- Outside the guest (``TESTBED_ADDR`` unset) they skip.
- Inside the guest a skip is a FAILURE, always (a missing rxe0, knfsd or RDMA transport must
  not pass silently: the test bed has them all). A junit XML goes to ``TESTBED_OUT``.

Fixtures: ``testbed`` (addresses, out dir), ``rxe`` (the device, checked), ``knfsd``
(checked listeners and export), ``nfs_mount`` (mount any server, unmounted at teardown),
``artefacts`` (a per-test directory under TESTBED_OUT), ``background`` (processes stopped at
teardown, logs in ``artefacts``). Helpers for anything else: :mod:`nfsrdma.testbed.helpers`.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from nfsrdma.testbed.constants import (
    ENV_EXPORT,
    JUNIT_FILE,
    KNFSD_RDMA_PORT,
    KNFSD_TCP_PORT,
)
from nfsrdma.testbed.helpers import (
    Background,
    BackgroundFactory,
    GuestEnv,
    Knfsd,
    MountFactory,
    NfsMount,
    NfsServer,
    artefact_dir,
    in_testbed,
    is_mounted,
    mount_nfs,
    out_dir,
    testbed_addr,
    umount,
)

HERE = Path(__file__).parent
MOUNT_ROOT = Path("/tmp/testbed-mnt")
_mount_seq = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    if in_testbed() and getattr(config.option, "xmlpath", None) is None:
        # Picked up by the junitxml plugin's own pytest_configure, which runs after this one.
        config.option.xmlpath = str(out_dir() / JUNIT_FILE)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    inside = in_testbed()
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.testbed)
        if not inside:
            item.add_marker(
                pytest.mark.skip(reason="runs in the test-bed VM only (make test-testbed)")
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if in_testbed() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped inside the test bed, which counts as a failure: {reason}"
    return report


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def testbed() -> GuestEnv:
    if not in_testbed():
        pytest.skip("not inside the test-bed VM")
    return GuestEnv(addr=testbed_addr(), out=out_dir())


@pytest.fixture(scope="session")
def rxe(testbed: GuestEnv) -> str:
    """The soft-RoCE device, ACTIVE; fails (not skips) when missing."""
    state = Path(f"/sys/class/infiniband/{testbed.rxe}/ports/1/state")
    if not state.exists():
        pytest.fail(f"{testbed.rxe} is missing in the test bed ({state})")
    if "ACTIVE" not in state.read_text():
        pytest.fail(f"{testbed.rxe} is not ACTIVE: {state.read_text().strip()}")
    return testbed.rxe


@pytest.fixture(scope="session")
def knfsd(testbed: GuestEnv, rxe: str) -> Knfsd:
    """knfsd with its export; fails when the test bed runs without it (``--knfsd``)."""
    export = os.environ.get(ENV_EXPORT)
    if not export:
        pytest.fail(f"{ENV_EXPORT} unset: the test bed was started without --knfsd")
    listeners = Knfsd.listeners()
    for want in (f"rdma {KNFSD_RDMA_PORT}", f"tcp {KNFSD_TCP_PORT}"):
        if want not in listeners:
            pytest.fail(f"knfsd is not listening on {want} (portlist: {sorted(listeners)})")
    return Knfsd(addr=testbed.addr, export=Path(export))


@pytest.fixture
def artefacts(request: pytest.FixtureRequest, testbed: GuestEnv) -> Path:
    """A directory under TESTBED_OUT for this test's files (kept by the host)."""
    return artefact_dir(request.node.nodeid)


@pytest.fixture
def nfs_mount(request: pytest.FixtureRequest, testbed: GuestEnv) -> Iterator[MountFactory]:
    """``nfs_mount(server, options=(), vers="4.1", check_xprt=True) -> NfsMount``: mounts at a
    fresh point under /tmp/testbed-mnt; everything still mounted is unmounted at teardown
    (newest first)."""
    made: list[NfsMount] = []
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]

    def mount(
        server: NfsServer,
        *,
        options: Sequence[str] = (),
        vers: str = "4.1",
        check_xprt: bool = True,
    ) -> NfsMount:
        point = MOUNT_ROOT / f"{base}-{next(_mount_seq)}"
        m = mount_nfs(server, point, vers=vers, options=options, check_xprt=check_xprt)
        made.append(m)
        return m

    yield mount
    errors: list[str] = []
    for m in reversed(made):
        if is_mounted(m.mountpoint):
            try:
                umount(m.mountpoint)
            except Exception as exc:  # keep unmounting the others
                errors.append(str(exc))
    if errors:
        pytest.fail("unmount failed at teardown:\n" + "\n".join(errors))


@pytest.fixture
def background(artefacts: Path) -> Iterator[BackgroundFactory]:
    """``background(argv, name=..., env=None) -> Background`` (started); stopped at teardown."""
    started: list[Background] = []

    def start(
        argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None
    ) -> Background:
        proc = Background(argv, log=artefacts / f"{name}.log", env=env).start()
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
