"""Kerberos in the test bed, one boot: a realm and KDC in the guest (tests/kdc.py and
kerberos_realm.py), rpc.gssd for the Linux client and rpc.svcgssd for knfsd, and

- the Linux client mounts our server with sec=krb5, krb5i and krb5p over TCP and over RDMA and
  runs a small workload as a Kerberos user (alice, uid 1500): the same results as with
  sec=sys, files owned by alice on the server. Over RDMA the server's RPC-over-RDMA counters
  show how the Linux client moves the data: READ data in Write chunks under sys and krb5, and
  under krb5i and krb5p (where the checksum or the encryption covers the data: RFC 8166
  section 9.2) Long Calls and Reply chunks, with no data chunk offered or filled. For the RDMA
  mounts our server runs on TCP 2049 with knfsd stopped: rpc.gssd makes an RDMA mount's
  contexts over TCP to port 2049;
- a user without a ticket is refused (EACCES);
- our client writes and reads as alice against knfsd (rpc.svcgssd) with krb5 and krb5i over TCP
  and RDMA (Debian's 6.1 kernel answers every krb5p COMPOUND with GARBAGE_ARGS after a
  successful unwrap, a knfsd bug fixed by 6.12: docs/kerberos.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.stats.admin import query, socket_path
from nfsrdma.testbed.constants import KNFSD_TCP_PORT
from nfsrdma.testbed.helpers import Knfsd, MountFactory, Proto, artefact_dir, drop_caches
from nfsrdma.testbed.ours import OurServer, our_server
from tests.kdc import SERVER_HOST, Kdc
from tests.testbed.kerberos_realm import (
    ALICE,
    ALICE_CC,
    BOB,
    as_user,
    guest_realm,
    knfsd_stopped,
)

pytestmark = pytest.mark.testbed

# The workload, run as a user through the mount: a tree, files written and read back,
# rename, link, symlink, chmod, truncate, a listing, removal. Prints a JSON result that does
# not depend on the server.
WORKLOAD = r"""
import hashlib, json, os, sys
root = os.path.join(sys.argv[1], "kwl")
os.makedirs(root)
out = {"sums": {}}
for d in range(4):
    os.makedirs(f"{root}/tree/d{d}")
    for f in range(5):
        data = hashlib.sha256(f"{d}/{f}".encode()).digest() * (97 * (f + 1))
        with open(f"{root}/tree/d{d}/f{f}", "wb") as fh:
            fh.write(data)
big = hashlib.sha256(b"big").digest() * 32768
with open(f"{root}/big", "wb") as fh:
    fh.write(big)
    os.fsync(fh.fileno())
with open(f"{root}/big", "rb") as fh:
    out["big_ok"] = fh.read() == big
os.rename(f"{root}/tree/d0/f0", f"{root}/tree/d1/moved")
os.link(f"{root}/tree/d1/f1", f"{root}/hard")
os.symlink("tree/d2/f2", f"{root}/soft")
os.chmod(f"{root}/tree/d3/f3", 0o600)
os.truncate(f"{root}/tree/d3/f4", 100)
for dirpath, dirs, files in os.walk(root):
    for name in sorted(files):
        p = os.path.join(dirpath, name)
        rel = os.path.relpath(p, root)
        st = os.lstat(p)
        if os.path.islink(p):
            out["sums"][rel] = "-> " + os.readlink(p)
        else:
            with open(p, "rb") as fh:
                out["sums"][rel] = f"{oct(st.st_mode)} {st.st_nlink} " + hashlib.sha256(fh.read()).hexdigest()
out["owner"] = os.stat(f"{root}/big").st_uid
with open(f"{root}/owned-by-me", "w") as fh:
    fh.write("x")
print(json.dumps(out, sort_keys=True))
"""


def workload(mnt: Path, uid: int, ccache: str | None) -> dict[str, Any]:
    done = as_user(uid, ["/usr/bin/python3", "-c", WORKLOAD, str(mnt)], ccache)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def realm(knfsd: Knfsd) -> Iterator[Kdc]:
    """The realm, the names, the users, the GSS daemons, and knfsd exporting with Kerberos."""
    with guest_realm(knfsd, Path("/run/krb5-realm")) as kdc:
        yield kdc


@pytest.fixture(scope="module")
def ours(realm: Kdc) -> Iterator[OurServer]:
    extra = ("--sec", "krb5p,krb5i,krb5,sys", "--keytab", "/etc/krb5.keytab")
    with our_server("kerberos", rdma=False, extra=(*extra, "--gss-host", SERVER_HOST)) as srv:
        os.chmod(srv.export, 0o777)
        yield srv


BIG_SHA256 = hashlib.sha256(hashlib.sha256(b"big").digest() * 32768).hexdigest()
# The RPC-over-RDMA counters of our server the test compares (nfsrdma stats).
CHUNK_COUNTERS = (
    "calls_inline", "calls_long", "replies_inline", "replies_long", "read_chunks_received",
    "write_chunks_offered", "write_chunks_filled", "reply_chunks_offered",
)  # fmt: skip


def rdma_counters(state_dir: str) -> dict[str, int]:
    snap = query(socket_path(state_dir))["stats"]
    counters: dict[str, int] = snap.get("rdma", {}).get("counters", {})
    return {k: int(counters.get(k, 0)) for k in CHUNK_COUNTERS}


def linux_client_workloads(
    srv: OurServer, state_dir: str, proto: Proto, nfs_mount: MountFactory
) -> dict[str, dict[str, int]]:
    """The workload as alice under each flavour: the same results as under sys. Returns the
    server's RPC-over-RDMA counters moved by each flavour's mount."""
    results = {}
    traffic: dict[str, dict[str, int]] = {}
    for sec in ("sys", "krb5", "krb5i", "krb5p"):
        before = rdma_counters(state_dir)
        with nfs_mount(srv.server(proto), options=(f"sec={sec}",)) as m:
            results[sec] = workload(m.mountpoint, ALICE, ALICE_CC)
            # The big file again, from the server this time (READs of up to rsize).
            drop_caches()
            got = as_user(ALICE, ["sha256sum", str(m.mountpoint / "kwl" / "big")], ALICE_CC)
            assert got.returncode == 0 and got.stdout.split()[0] == BIG_SHA256, (sec, got)
            if sec != "sys":
                # A user without a ticket is refused.
                # (gssd finds no credentials; the kernel fails the mount point's revalidation,
                # which a process sees as EACCES or, on the mount point itself, ESTALE.)
                denied = as_user(BOB, ["ls", str(m.mountpoint)], "FILE:/tmp/krb5cc_none")
                assert denied.returncode != 0 and not denied.stdout, denied
                assert "Permission denied" in denied.stderr or "Stale" in denied.stderr
            on_server = srv.export / "kwl"
            assert (on_server / "owned-by-me").stat().st_uid == ALICE, sec
            shutil.rmtree(on_server)
        after = rdma_counters(state_dir)
        traffic[sec] = {k: after[k] - before[k] for k in CHUNK_COUNTERS}
    (artefact_dir("kerberos") / f"rdma-traffic-{proto}.json").write_text(
        json.dumps(traffic, indent=1) + "\n"
    )
    assert results["sys"]["big_ok"] and results["sys"]["owner"] == ALICE
    for r in results.values():
        # How the client shows owners depends on its id mapping (numeric under sys only).
        r.pop("owner")
    for sec in ("krb5", "krb5i", "krb5p"):
        assert results[sec] == results["sys"], sec
    log = srv.proc.log.read_text()
    assert "RPCSEC_GSS context for alice@" in log
    return traffic


def test_linux_client_kerberos_mounts_of_our_server_tcp(
    ours: OurServer, nfs_mount: MountFactory
) -> None:
    linux_client_workloads(ours, "/tmp/kerberos-state", "tcp", nfs_mount)


@pytest.mark.parametrize("proto", ["tcp", "rdma"])
def test_our_client_against_knfsd_with_kerberos(proto: Proto, realm: Kdc, knfsd: Knfsd) -> None:
    import nfsrdma.client as nc

    server = knfsd.server(proto)
    scheme = "rdma" if proto == "rdma" else "nfs"
    data = os.urandom(3 << 20)

    async def main(sec: str) -> None:
        url = f"{scheme}://{server.addr}:{server.port}/"
        async with nc.connect(url, sec=sec, gss_host=SERVER_HOST, ccache=ALICE_CC) as fs:
            name = f"ours-{proto}-{sec}"
            await fs.write_bytes(name, data)
            assert await fs.read_bytes(name) == data
            # knfsd mapped alice@REALM to alice: the file is hers on its export.
            assert (knfsd.export / name).stat().st_uid == ALICE
            await fs.remove(name)

    for sec in ("krb5", "krb5i"):
        asyncio.run(main(sec))


@pytest.fixture
def ours_on_2049(realm: Kdc, knfsd: Knfsd) -> Iterator[OurServer]:
    """Our server on TCP 2049 (and RDMA 20050), knfsd stopped meanwhile: rpc.gssd makes the
    contexts of an RDMA mount over TCP to port 2049 (nfs-utils has no RPC-over-RDMA)."""
    extra = ("--sec", "krb5p,krb5i,krb5,sys", "--keytab", "/etc/krb5.keytab")
    with (
        knfsd_stopped(),
        our_server(
            "kerberos-rdma", extra=(*extra, "--gss-host", SERVER_HOST), tcp_port=KNFSD_TCP_PORT
        ) as srv,
    ):
        os.chmod(srv.export, 0o777)
        yield srv


def test_linux_client_kerberos_mounts_of_our_server_rdma(
    ours_on_2049: OurServer, nfs_mount: MountFactory
) -> None:
    """Last in this file: knfsd is stopped for it (see ``ours_on_2049``)."""
    traffic = linux_client_workloads(ours_on_2049, "/tmp/kerberos-rdma-state", "rdma", nfs_mount)
    # sys and krb5: the READ data is placed directly, in Write chunks. (Debian's 6.1 client
    # sends its large WRITEs as Long Calls under every flavour, none with a Read chunk.)
    for sec in ("sys", "krb5"):
        assert traffic[sec]["write_chunks_filled"] > 0, (sec, traffic)
    for sec in ("krb5i", "krb5p"):
        # The protected bodies are not split (RFC 8166 section 9.2): large calls come as Long
        # Calls, large replies go into the Reply chunk, no data item moves by itself.
        t = traffic[sec]
        assert t["calls_long"] > 0 and t["replies_long"] > 0, (sec, traffic)
        assert t["read_chunks_received"] == 0, (sec, traffic)
        assert t["write_chunks_offered"] == 0 and t["write_chunks_filled"] == 0, (sec, traffic)
