"""A real MIT Kerberos KDC on 127.0.0.1 for the RPCSEC_GSS tests.

A realm of its own in a temporary directory (its own krb5.conf and kdc.conf, chosen through
KRB5_CONFIG and KRB5_KDC_PROFILE), with:
- a user principal (``alice``) with a password and a keytab,
- the NFS service principal ``nfs/<SERVER_HOST>`` in the server's keytab,
- a machine principal ``host/<CLIENT_HOST>`` in the client machine's keytab.

Nothing here skips: a KDC that cannot start is an error (the packages are in scripts/setup.sh).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REALM = "NFSRDMA.TEST"
SERVER_HOST = "server.nfsrdma.test"
CLIENT_HOST = "client.nfsrdma.test"
USER = "alice"
NUMERIC_USER = "4242"  # no such user name: the numeric fallback makes it uid 4242
USER_PASSWORD = "alice-secret-1"
MASTER_PASSWORD = "master-secret-1"
ENCTYPES = "aes256-cts-hmac-sha1-96 aes128-cts-hmac-sha1-96"


def _free_port() -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (the KDC listens on both)."""
    for _ in range(50):
        with socket.socket() as t:
            t.bind(("127.0.0.1", 0))
            port = int(t.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                try:
                    u.bind(("127.0.0.1", port))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port for the KDC")


@dataclass
class Kdc:
    """A running KDC and the files made for it."""

    dir: Path
    port: int
    proc: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def krb5_conf(self) -> Path:
        return self.dir / "krb5.conf"

    @property
    def server_keytab(self) -> Path:
        return self.dir / "server.keytab"

    @property
    def user_keytab(self) -> Path:
        return self.dir / "alice.keytab"

    @property
    def numeric_keytab(self) -> Path:
        return self.dir / "numeric.keytab"

    @property
    def numeric_principal(self) -> str:
        return f"{NUMERIC_USER}@{REALM}"

    @property
    def machine_keytab(self) -> Path:
        return self.dir / "client-host.keytab"

    @property
    def user_principal(self) -> str:
        return f"{USER}@{REALM}"

    @property
    def machine_principal(self) -> str:
        return f"host/{CLIENT_HOST}@{REALM}"

    def kadmin(self, query: str) -> str:
        return _run(["/usr/sbin/kadmin.local", "-r", REALM, "-q", query], self.env)

    def kinit(self, ccache: Path, principal: str | None = None, keytab: Path | None = None) -> None:
        """A ticket-granting ticket for ``principal`` (the user by default) in ``ccache``."""
        env = dict(self.env, KRB5CCNAME=f"FILE:{ccache}")
        args = ["/usr/bin/kinit", "-c", f"FILE:{ccache}"]
        args += ["-k", "-t", str(keytab or self.user_keytab), principal or self.user_principal]
        _run(args, env)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _run(args: list[str], env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        args, env=env, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def start_kdc(base: Path) -> Kdc:
    """Make a realm under ``base`` and start krb5kdc on it; raise if anything fails."""
    for tool in ("/usr/sbin/krb5kdc", "/usr/sbin/kdb5_util", "/usr/sbin/kadmin.local"):
        if not os.access(tool, os.X_OK):
            raise RuntimeError(f"{tool} is missing: install krb5-kdc and krb5-admin-server")
    base.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    (base / "krb5.conf").write_text(
        f"""[libdefaults]
    default_realm = {REALM}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    dns_canonicalize_hostname = false
    rdns = false
    ignore_acceptor_hostname = false
    default_ccache_name = FILE:{base}/ccache-default
    default_keytab_name = FILE:{base}/server.keytab
    default_tkt_enctypes = {ENCTYPES}
    default_tgs_enctypes = {ENCTYPES}
    permitted_enctypes = {ENCTYPES}
    udp_preference_limit = 1

[realms]
    {REALM} = {{
        kdc = 127.0.0.1:{port}
        admin_server = 127.0.0.1:{port + 1}
    }}

[domain_realm]
    .nfsrdma.test = {REALM}
    nfsrdma.test = {REALM}
"""
    )
    (base / "kdc.conf").write_text(
        f"""[kdcdefaults]
    kdc_ports = {port}
    kdc_tcp_ports = {port}

[realms]
    {REALM} = {{
        database_name = {base}/principal
        key_stash_file = {base}/stash
        acl_file = {base}/kadm5.acl
        kdc_listen = 127.0.0.1:{port}
        kdc_tcp_listen = 127.0.0.1:{port}
        max_life = 10h
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}

[logging]
    kdc = FILE:{base}/kdc.log
"""
    )
    (base / "kadm5.acl").write_text("")
    env = dict(
        os.environ,
        KRB5_CONFIG=str(base / "krb5.conf"),
        KRB5_KDC_PROFILE=str(base / "kdc.conf"),
        KRB5CCNAME=f"FILE:{base}/ccache-default",
    )
    _run(["/usr/sbin/kdb5_util", "create", "-s", "-r", REALM, "-P", MASTER_PASSWORD], env)
    proc = subprocess.Popen(
        ["/usr/sbin/krb5kdc", "-n", "-r", REALM, "-P", str(base / "kdc.pid")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(base / "krb5kdc.stderr", "wb"),  # noqa: SIM115 - the child keeps it
    )
    kdc = Kdc(base, port, proc, env)
    try:
        kdc.kadmin(f"addprinc -pw {USER_PASSWORD} {USER}")
        kdc.kadmin(f"addprinc -randkey {NUMERIC_USER}")
        kdc.kadmin(f"ktadd -k {kdc.numeric_keytab} {NUMERIC_USER}")
        kdc.kadmin(f"addprinc -randkey nfs/{SERVER_HOST}")
        kdc.kadmin(f"addprinc -randkey host/{CLIENT_HOST}")
        kdc.kadmin(f"ktadd -k {kdc.server_keytab} nfs/{SERVER_HOST}")
        kdc.kadmin(f"ktadd -k {kdc.user_keytab} -norandkey {USER}")
        kdc.kadmin(f"ktadd -k {kdc.machine_keytab} host/{CLIENT_HOST}")
        _wait_listening(kdc)
    except BaseException:
        kdc.stop()
        raise
    return kdc


def _wait_listening(kdc: Kdc, timeout: float = 30.0) -> None:
    """The KDC answers TCP connections (it binds after loading the database)."""
    deadline = time.monotonic() + timeout
    while True:
        if kdc.proc.poll() is not None:
            err = (kdc.dir / "krb5kdc.stderr").read_text(errors="replace")
            raise RuntimeError(f"krb5kdc exited with {kdc.proc.returncode}: {err.strip()}")
        try:
            with socket.create_connection(("127.0.0.1", kdc.port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"krb5kdc does not listen on 127.0.0.1:{kdc.port}") from None
            # The KDC's start is not something we can wait on: poll its port briefly.
            time.sleep(0.05)


def remove(kdc: Kdc) -> None:
    kdc.stop()
    shutil.rmtree(kdc.dir, ignore_errors=True)
