"""A Kerberos realm inside the test-bed guest, for tests/testbed/test_kerberos.py and
bench/gss.py: the KDC (tests/kdc.py), the host names, two users (alice with a ticket, bob
without), rpc.idmapd, rpc.svcgssd for knfsd and rpc.gssd for the Linux client, and knfsd
exporting with ``sec=sys:krb5:krb5i:krb5p``.

``knfsd_stopped()`` frees TCP port 2049 for our server: for a mount over RDMA, rpc.gssd
makes the RPCSEC_GSS contexts over TCP to port 2049 of the server's address (nfs-utils has no
RPC-over-RDMA), so a Kerberos mount of our server over RDMA needs our server on TCP 2049.

Safe to enter more than once in one boot (each time a fresh realm under its own directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from nfsrdma.testbed.constants import (
    KNFSD_GRACE_TIME,
    KNFSD_RDMA_PORT,
    KNFSD_TCP_PORT,
    KNFSD_THREADS,
)
from nfsrdma.testbed.guest import GraceWatch
from nfsrdma.testbed.helpers import (
    Background,
    Knfsd,
    artefact_dir,
    rdma_listening,
    run,
    tcp_listening,
)
from nfsrdma.testbed.helpers import testbed_addr as guest_addr
from tests.kdc import SERVER_HOST, Kdc, start_kdc

ALICE, BOB = 1500, 1501
ALICE_CC = f"FILE:/tmp/krb5cc_{ALICE}"
KNFSD_SEC = "sec=sys:krb5:krb5i:krb5p"


def as_user(uid: int, argv: list[str], ccache: str | None) -> subprocess.CompletedProcess[str]:
    env = [f"KRB5CCNAME={ccache}"] if ccache else []
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", *env, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def holds_open(proc: Background, what: str) -> bool:
    """The daemon has a descriptor on a path containing ``what`` (it is serving upcalls)."""
    assert proc.proc is not None
    fds = Path(f"/proc/{proc.proc.pid}/fd")
    try:
        return any(what in os.readlink(fd) for fd in fds.iterdir())
    except OSError:
        return False


def _add_users() -> None:
    # useradd fails on the guest's /etc overlay: append the users (once per boot).
    if "alice:" in Path("/etc/passwd").read_text():
        return
    with open("/etc/passwd", "a") as f:
        f.write(f"alice:x:{ALICE}:{ALICE}::/tmp:/bin/sh\nbob:x:{BOB}:{BOB}::/tmp:/bin/sh\n")
    with open("/etc/group", "a") as f:
        f.write(f"alice:x:{ALICE}:\nbob:x:{BOB}:\n")


def _export_with_kerberos(knfsd: Knfsd) -> None:
    exports = Path("/etc/exports").read_text()
    lines = [
        line.replace(")", f",{KNFSD_SEC})", 1)
        if line.startswith(str(knfsd.export)) and KNFSD_SEC not in line
        else line
        for line in exports.splitlines()
    ]
    Path("/etc/exports").write_text("\n".join(lines) + "\n")
    run(["exportfs", "-ra"])
    os.chmod(knfsd.export, 0o777)


@contextmanager
def guest_realm(knfsd: Knfsd, base: Path) -> Iterator[Kdc]:
    """The realm (under ``base``, which must not exist yet), names, users, GSS daemons, and
    knfsd exporting with Kerberos; alice holds a ticket in ``ALICE_CC``."""
    addr = guest_addr()
    run(["hostname", SERVER_HOST])
    Path("/etc/hosts").write_text(f"127.0.0.1 localhost\n{addr} {SERVER_HOST} server\n")
    Path("/etc/idmapd.conf").write_text(
        "[General]\nDomain = nfsrdma.test\n[Mapping]\nNobody-User = nobody\n"
        "Nobody-Group = nogroup\n"
    )
    kdc = start_kdc(base)
    # The system's krb5.conf: the realm's, without its test-process defaults (ccache, keytab).
    conf = [
        line
        for line in kdc.krb5_conf.read_text().splitlines()
        if "default_ccache_name" not in line and "default_keytab_name" not in line
    ]
    Path("/etc/krb5.conf").write_text("\n".join(conf) + "\n")
    shutil.copy(kdc.server_keytab, "/etc/krb5.keytab")
    os.chmod("/etc/krb5.keytab", 0o600)
    _add_users()
    keytab = Path("/tmp/alice.keytab")
    shutil.copy(kdc.user_keytab, keytab)
    os.chown(keytab, ALICE, ALICE)
    got = as_user(ALICE, ["kinit", "-k", "-t", str(keytab), kdc.user_principal], ALICE_CC)
    if got.returncode != 0:
        kdc.stop()
        raise RuntimeError(f"kinit as alice failed: {got.stderr}")
    run(["modprobe", "-a", "auth_rpcgss", "rpcsec_gss_krb5"])
    logs = artefact_dir(f"kerberos-{base.name}")
    daemons = [
        Background(["rpc.idmapd", "-f"], log=logs / "idmapd.log").start(),
        Background(["rpc.svcgssd", "-f", "-v"], log=logs / "svcgssd.log").start(),
        Background(["rpc.gssd", "-f", "-v"], log=logs / "gssd.log").start(),
    ]
    try:
        daemons[1].wait_ready(lambda: holds_open(daemons[1], "auth.rpcsec"), timeout=60)
        daemons[2].wait_ready(lambda: holds_open(daemons[2], "rpc_pipefs"), timeout=60)
        _export_with_kerberos(knfsd)
        yield kdc
    finally:
        for d in reversed(daemons):
            d.stop()
        kdc.stop()


def _wait(predicate: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f} s")
        time.sleep(0.1)


@contextmanager
def knfsd_stopped() -> Iterator[None]:
    """knfsd off (its listeners closed, TCP 2049 free) inside the block; started again
    afterwards as the test bed starts it, returning once its grace period is over."""
    run(["rpc.nfsd", "0"])
    _wait(lambda: not tcp_listening(KNFSD_TCP_PORT), "knfsd does not close TCP 2049", 30)
    try:
        yield
    finally:
        watch = GraceWatch()
        watch.arm()
        try:
            run(["rpc.nfsd", "-N", "3", f"--rdma={KNFSD_RDMA_PORT}", str(KNFSD_THREADS)])
            _wait(lambda: tcp_listening(KNFSD_TCP_PORT), "knfsd does not listen on TCP", 30)
            _wait(lambda: rdma_listening(KNFSD_RDMA_PORT), "knfsd does not listen on RDMA", 30)
            if watch.armed:
                # Clients known to nfsdcld (the earlier mounts) make knfsd wait them out.
                # (No grace period, when there is no client to reclaim: nothing to wait for.)
                with suppress(TimeoutError):
                    _wait(watch.ended, "knfsd's grace period does not end", KNFSD_GRACE_TIME + 15)
        finally:
            watch.disarm()
