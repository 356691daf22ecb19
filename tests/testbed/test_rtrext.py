"""The rtrext extension on rxe (issue 13): our client and our server with the extension on run
the client workload of the suite with the same results as with it off, and the kernel's peers
(the Linux client against our server, our client against knfsd) see plain RPC-over-RDMA v1:
zero rtrext traffic by the connections' counters, unchanged results."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.testbed.helpers import Knfsd, MountFactory
from nfsrdma.testbed.helpers import testbed_addr as guest_addr
from nfsrdma.testbed.ours import OURS_RDMA_PORT, OurServer, our_server
from nfsrdma.transport.rdma.connection_base import RTR_COUNTERS
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
from nfsrdma.transport.rdma.pyverbs_provider import open_device
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer
from tests.unit.client import test_api

pytestmark = pytest.mark.testbed

BIG_DIR = 300  # entries: a READDIR reply with attributes of well over the 4 KiB inline size
ATTRS = bitmap_of(
    [nfs4.FATTR4_TYPE, nfs4.FATTR4_MODE, nfs4.FATTR4_SIZE, nfs4.FATTR4_OWNER,
     nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_NUMLINKS]
)  # fmt: skip


@pytest.fixture(scope="module")
def ours(knfsd: Knfsd) -> Iterator[OurServer]:
    with our_server("rtrext") as srv:
        yield srv


@dataclass
class OursTarget:
    """Our server in the shape the host client tests expect (``url()``)."""

    addr: str
    max_file: int = 1 << 40

    def url(self, port: int | None = None) -> str:
        return f"rdma://{self.addr}:{port or OURS_RDMA_PORT}/"


def closed_counters(log: str, peer_port: int | None = None) -> list[dict[str, int]]:
    """The counters of every connection our server logged as closed."""
    out = []
    for line in log.splitlines():
        if m := re.search(r"rdma (\S+): closed; (.*)$", line):
            if peer_port is not None and not m.group(1).endswith(f":{peer_port}"):
                continue
            out.append({k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())})
    return out


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Until ``cond()`` holds (a state outside this process: a server's log)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


async def until(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """``wait_for`` that keeps the event loop running."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def snapshot(root: Path) -> list[tuple[str, str, int, str]]:
    """What the workload left under ``root``, independent of the server's inode numbers and
    times: (relative path, type, size, content hash or link target)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out.append((rel, "l", 0, os.readlink(p)))
            elif stat.S_ISDIR(st.st_mode):
                out.append((rel, "d", 0, ""))
            else:
                out.append((rel, "f", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest()))
    return sorted(out)


async def _big_listing(
    target: OursTarget, testdir: str
) -> tuple[list[tuple[str, int, int]], bytes]:
    """A directory of BIG_DIR files listed with attributes, and a COMPOUND of a 10,000-octet
    tag and 20 GETATTRs (a call and a reply of about 10 KiB: a Long call and a Reply chunk in
    plain v1, several Sends each way with the extension)."""
    async with nc.connect(target.url(), uid=0, gid=0) as fs:
        await fs.makedirs(f"{testdir}/big")
        await asyncio.gather(
            *(
                fs.write_bytes(f"{testdir}/big/file-{i:04d}", b"y" * (i % 13))
                for i in range(BIG_DIR)
            )
        )
        listing = []
        async for e in fs.scandir(f"{testdir}/big"):
            assert e.stat is not None
            listing.append((e.name, e.stat.st_size, stat.S_IFMT(e.stat.st_mode)))
        # Attributes of the root that the workload does not change (its size and link count
        # grow with each phase's directory).
        attrs = bitmap_of(
            [nfs4.FATTR4_TYPE, nfs4.FATTR4_MODE, nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP]
        )
        ops = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]
        ops += [nfs4.nfs_argop4(nfs4.OP_GETATTR, nfs4.GETATTR4args(attrs))] * 20
        res = await fs.session.compound(ops, reply_size=16 * 1024, tag=b"t" * 10_000)
        assert res.status == nfs4.NFS4_OK and len(res.resarray) == 21
        w = Writer()
        nfs4.enc_COMPOUND4res(w, res)
        return sorted(listing), bytes(w)


async def test_rtx4_tbsn_writes_land_byte_exact_with_no_rdma_read(knfsd: Knfsd) -> None:
    """RT-X4 on rxe: our server with --rtrext-tbsn, our client with rtrext_tbsn=True. Files of
    8 KiB to 200 KiB written through the client API (one WRITE each) read back byte-exact;
    the server's counters show every WRITE's data placed by TBSN, no RDMA Read, no fault.
    Runs first in this module, with its own server (the module's ``ours`` starts after)."""
    with our_server("tbsn", extra=("--rtrext-tbsn",)) as srv:
        target = OursTarget(guest_addr())
        sizes = [8 * 1024, 32 * 1024, 128 * 1024, 200_000, 4097, 77_777]
        blobs = {n: os.urandom(n) for n in sizes}
        async with nc.connect(
            target.url(), uid=0, gid=0, gids=tuple(os.getgroups()), rtrext_tbsn=True
        ) as fs:
            await fs.makedirs("tbsn")
            for n, blob in blobs.items():
                await fs.write_bytes(f"tbsn/f{n}", blob)
            for n, blob in blobs.items():
                assert await fs.read_bytes(f"tbsn/f{n}") == blob, n
        for n, blob in blobs.items():
            assert (srv.export / "tbsn" / f"f{n}").read_bytes() == blob
        wait_for(lambda: bool(closed_counters(srv.proc.log.read_text())), "the close")
        on = closed_counters(srv.proc.log.read_text())
        total = {k: sum(c.get(k, 0) for c in on) for k in on[0]}
        assert total["rtr_tbsn_items"] >= len(sizes), total
        assert total["rdma_reads"] == 0 and total["rtr_faults"] == 0, total


async def test_rtx3_our_client_workload_same_with_rtrext_on_and_off(
    ours: OurServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RT-X1/RT-X3/RT-6/RT-8 on rxe: the client API workload of the suite (metadata
    operations, a file object, byte-range locks between two clients, many stats batched), a
    300-entry directory listed with attributes and a 10 KiB COMPOUND of 20 GETATTRs run
    against our server over RDMA with the extension on and with it off; the files left, the
    listing and the COMPOUND's results are identical. The server's counters: with the
    extension, continued calls and replies and no RDMA Read; without it, no rtrext traffic at
    all, and the Long call and Reply chunk v1 needs instead."""
    target = OursTarget(guest_addr())
    connect = nc.connect
    results: dict[
        bool, tuple[list[tuple[str, str, int, str]], list[tuple[str, int, int]], bytes]
    ] = {}
    counters: dict[bool, list[dict[str, int]]] = {}
    for rtrext in (True, False):
        # Every connection of the workload offers (or not) the extension; the client acts as
        # the server process's own identity (uid 0 and its groups, with --no-root-squash).
        monkeypatch.setattr(
            nc, "connect", functools.partial(connect, rtrext=rtrext, gids=tuple(os.getgroups()))
        )
        root = "api-on" if rtrext else "api-off"
        log_before = len(ours.proc.log.read_text())
        where = ours.export / root
        listing, compound = await _big_listing(target, root)
        assert len(listing) == BIG_DIR
        await test_api.test_metadata_operations(target, f"{root}/meta", where / "meta")  # type: ignore[arg-type]
        await test_api.test_file_object(target, f"{root}/file", where / "file")  # type: ignore[arg-type]
        await test_api.test_locks(target, f"{root}/locks")  # type: ignore[arg-type]
        await test_api.test_stat_many(target, f"{root}/many")  # type: ignore[arg-type]
        results[rtrext] = (snapshot(where), listing, compound)

        def all_closed(start: int = log_before) -> bool:
            new = ours.proc.log.read_text()[start:]
            return len(closed_counters(new)) >= 6  # every connection the workload made

        await until(all_closed, "the workload's connections to close")
        counters[rtrext] = closed_counters(ours.proc.log.read_text()[log_before:])
    monkeypatch.setattr(nc, "connect", connect)
    assert results[True] == results[False]
    on = {k: sum(c.get(k, 0) for c in counters[True]) for k in counters[True][0]}
    off = {k: sum(c[k] for c in counters[False]) for k in counters[False][0]}
    # The server's side: with the extension, calls came as XMTREQ groups (the 10 KiB one as
    # several Sends, none read by RDMA Read) and the 10 KiB reply went as an XMTRESP group.
    assert on["rtr_calls_received"] >= 1 and on["rtr_replies_sent"] >= 1, on
    assert on["rtr_faults"] == 0 and on["rdma_reads"] == 0, on
    assert all(off[k] == 0 for k in RTR_COUNTERS), off
    assert off["rdma_reads"] >= 1, off  # the same call was a Long call in plain v1
    assert off["rdma_writes"] >= on["rdma_writes"] + 1, (on, off)  # and its Reply chunk


def test_rt1_linux_client_sees_plain_v1_from_our_server(
    ours: OurServer, knfsd: Knfsd, nfs_mount: MountFactory
) -> None:
    """RT-1/RT-X1/PD-20: the Linux client, which sends no rtrext block, mounts our server (the
    extension offered, the default) over RDMA; a small workload (files written and read back,
    a 300-entry directory listed with attributes, a rename and a removal) gives the same
    results as on knfsd, and the connection's counters show zero rtrext traffic."""

    def workload(root: Path) -> list[tuple[str, str, int, str]]:
        base = root / "linux-rtr"
        (base / "big").mkdir(parents=True)
        for i in range(BIG_DIR):
            (base / "big" / f"entry-{i:04d}").write_bytes(b"z" * (i % 17))
        (base / "blob").write_bytes(hashlib.sha256(b"blob").digest() * 3000)  # 96000 octets
        os.rename(base / "big" / "entry-0000", base / "moved")
        (base / "big" / "entry-0001").unlink()
        listing = [(e.name, e.stat().st_size) for e in os.scandir(base / "big")]
        assert len(listing) == BIG_DIR - 2
        return snapshot(base)

    with nfs_mount(knfsd.server("rdma")) as m:
        reference = workload(m.mountpoint)
    log_before = len(ours.proc.log.read_text())
    with nfs_mount(ours.server("rdma")) as m:
        assert m.stats().xprt == "rdma"
        result = workload(m.mountpoint)
    assert result == reference

    def closed() -> bool:
        return bool(closed_counters(ours.proc.log.read_text()[log_before:]))

    wait_for(closed, "the Linux client's connection to close after the unmount")
    new = ours.proc.log.read_text()[log_before:]
    assert re.findall(r"rtrext RtrState\(enabled=(\w+)", new) == ["False"] * len(
        re.findall(r"rtrext RtrState\(enabled=", new)
    )
    for c in closed_counters(new):
        assert all(c[k] == 0 for k in RTR_COUNTERS), c
        assert c["sends"] > 0


async def test_rt1_our_client_with_knfsd_sends_plain_v1(knfsd: Knfsd) -> None:
    """RT-1 with knfsd: our client offers the extension (the default); knfsd's accept carries
    no rtrext block, so the connection stays plain v1. A COMPOUND of 20 GETATTRs and a READDIR
    with attributes of a 300-entry directory (a Reply chunk offered, as v1 does) give the same
    results as on a connection that did not offer the extension, and every rtrext counter is 0.
    (knfsd refuses COMPOUND tags over 128 octets, so no Long call is made here.)"""
    device = await open_device(guest_addr())
    conns: list[RdmaConnection] = []
    (knfsd.export / "rtr-big").mkdir(exist_ok=True)
    for i in range(BIG_DIR):
        (knfsd.export / "rtr-big" / f"k-{i:04d}").write_bytes(b"k" * (i % 11))

    async def results(rtrext: bool) -> bytes:
        async def connect() -> RdmaConnection:
            conn = await connect_rdma(
                device, guest_addr(), knfsd.rdma_port, RdmaOptions(rtrext=rtrext)
            )
            conns.append(conn)
            return conn

        session = ClientSession(connect, SessionOptions(backchannel=False))
        await session.start()
        try:
            assert not conns[-1].rtr.enabled
            ops = [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH)]
            ops += [nfs4.nfs_argop4(nfs4.OP_GETATTR, nfs4.GETATTR4args(ATTRS))] * 20
            res = await session.compound(ops)
            assert res.status == nfs4.NFS4_OK and len(res.resarray) == 21, res.status
            w = Writer()
            nfs4.enc_COMPOUND4res(w, res)
            res = await session.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTROOTFH),
                    nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"rtr-big")),
                    nfs4.nfs_argop4(
                        nfs4.OP_READDIR, nfs4.READDIR4args(0, bytes(8), 4096, 32768, ATTRS)
                    ),
                ],
                reply_size=32768 + 512,
            )
            assert res.status == nfs4.NFS4_OK
            names = []
            entries = res.resarray[2].value.value.reply.entries
            for e in entries or []:
                names.append(e.name)
            assert len(names) > 50
            return bytes(w) + b"\0".join(names)
        finally:
            await session.close()

    try:
        on = await results(True)
        off = await results(False)
        assert on == off
        for conn in conns:
            assert all(conn.stats[k] == 0 for k in RTR_COUNTERS), conn.counters()
            assert conn.stats["reply_chunks"] >= 1 and conn.stats["sends"] >= 4
    finally:
        ends = []
        for c in conns:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            c.on_closed(lambda _c, _e, f=fut: f.done() or f.set_result(None))
            ends.append(fut)
            c.close()
        await asyncio.wait_for(asyncio.gather(*ends), 30)
        device.close()
