"""Faults between the client and a server (NFS-Ganesha, our own), injected by a TCP proxy (UL-25, UL-26, UL-27,
SS-13, TR-20, TR-23): unknown XIDs, malformed replies, NFS4ERR_DELAY storms, a server that stops
answering, connections killed mid-WRITE and mid-RENAME (exactly once), cancellation mid-read."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import nfsrdma.client as nc
from nfsrdma.client.fs import NfsClient
from nfsrdma.xdr.gen import nfs4

from .conftest import Server
from .faultproxy import Call, FaultProxy, Link, Reply, Rule, Verdict, sequence_error_reply
from .serverfiles import ServerFiles


@asynccontextmanager
async def through_proxy(
    nfs_server: Server, **kw: object
) -> AsyncIterator[tuple[NfsClient, FaultProxy]]:
    proxy = await FaultProxy(nfs_server.port).start()
    try:
        kw.setdefault("timeout", 1.0)
        async with nc.connect(nfs_server.url(proxy.port), uid=0, gid=0, **kw) as fs:  # type: ignore[arg-type]
            yield fs, proxy
    finally:
        await proxy.stop()


class _Buffer(bytearray):
    """A bytearray that can be watched with a weak reference."""


def once(pred, verdict: Verdict = Verdict.DROP_CONNECTION):  # type: ignore[no-untyped-def]
    fired: list[object] = []

    def rule(item, link: Link) -> Verdict:  # type: ignore[no-untyped-def]
        if not fired and pred(item):
            fired.append(item)
            return verdict
        return Verdict.FORWARD

    rule.fired = fired  # type: ignore[attr-defined]
    return rule


async def test_reply_with_unknown_xid_is_ignored(
    nfs_server: Server, testdir: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with through_proxy(nfs_server) as (fs, proxy):
        await fs.mkdir(testdir)

        def inject(reply: Reply, link: Link) -> Verdict:
            if reply.call is not None and reply.call.has(nfs4.OP_GETATTR):
                link.to_client(sequence_error_reply(reply.xid ^ 0x5A5A5A5A, nfs4.NFS4ERR_IO))
            return Verdict.FORWARD

        proxy.rules.append(Rule(on_reply=inject))
        with caplog.at_level(logging.INFO, logger="nfsrdma.rpc.connection"):
            st = await fs.stat(testdir)
        assert st.is_dir()
        assert "unknown xid" in caplog.text
        assert fs.session.stats.connects == 1  # the connection survived


async def test_malformed_reply_reconnects_and_gets_the_cached_reply(
    nfs_server: Server, testdir: str
) -> None:
    async with through_proxy(nfs_server) as (fs, proxy):
        await fs.mkdir(testdir)

        def corrupt(reply: Reply, link: Link) -> Verdict:
            if reply.call is not None and reply.call.has(nfs4.OP_CREATE) and not corrupt.done:
                corrupt.done = True  # type: ignore[attr-defined]
                link.to_client(reply.raw[:40] + b"\xff" * 12)  # a truncated COMPOUND4res
                return Verdict.SWALLOW
            return Verdict.FORWARD

        corrupt.done = False  # type: ignore[attr-defined]
        proxy.rules.append(Rule(on_reply=corrupt))
        await fs.mkdir(f"{testdir}/d")  # no FileExistsError: the resend got the cached reply
        assert await fs.isdir(f"{testdir}/d")
        s = fs.session.stats
        assert s.malformed == 1 and s.connects == 2 and s.resends == 1
        creates = [
            c for c in proxy.find(nfs4.OP_CREATE) if c.args.argarray[-1].value.objname == b"d"
        ]
        assert len(creates) == 2 and (creates[0].slot, creates[0].seqid) == (
            creates[1].slot,
            creates[1].seqid,
        )


async def test_delay_storm_backs_off_and_recovers(nfs_server: Server, testdir: str) -> None:
    async with through_proxy(nfs_server) as (fs, proxy):
        await fs.mkdir(testdir)
        answered: list[float] = []

        def storm(call: Call, link: Link) -> Verdict:
            if call.has(nfs4.OP_GETATTR) and len(answered) < 8:
                answered.append(time.monotonic())
                link.to_client(sequence_error_reply(call.xid, nfs4.NFS4ERR_DELAY))
                return Verdict.SWALLOW
            return Verdict.FORWARD

        proxy.rules.append(Rule(on_call=storm))
        assert (await fs.stat(testdir)).is_dir()
        gaps = [b - a for a, b in itertools.pairwise(answered)]
        assert len(answered) == 8 and fs.session.stats.delays == 8
        assert gaps[-1] > gaps[0]  # exponential ...
        assert max(gaps) < 1.5  # ... and bounded


async def test_endless_delay_gives_up(nfs_server: Server, testdir: str) -> None:
    async with through_proxy(nfs_server, delay_deadline=0.5) as (fs, proxy):
        await fs.mkdir(testdir)

        def storm(call: Call, link: Link) -> Verdict:
            if call.has(nfs4.OP_GETATTR):
                link.to_client(sequence_error_reply(call.xid, nfs4.NFS4ERR_DELAY))
                return Verdict.SWALLOW
            return Verdict.FORWARD

        proxy.rules.append(Rule(on_call=storm))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            await fs.stat(testdir)
        assert time.monotonic() - t0 < 3
        proxy.rules.clear()
        assert await fs.listdir(testdir) == []  # the slot is fine afterwards
        assert fs.session.slots.in_flight == 0


async def test_server_that_stops_answering_is_detected(nfs_server: Server, testdir: str) -> None:
    """UL-26: the server goes silent without closing; a NULL probe times out, the client
    reconnects and the call completes on the new connection."""
    async with through_proxy(nfs_server, timeout=0.5) as (fs, proxy):
        await fs.mkdir(testdir)
        proxy.freeze()
        t0 = time.monotonic()
        st = await asyncio.wait_for(fs.stat(testdir), 20)
        assert st.is_dir()
        s = fs.session.stats
        assert s.connects == 2 and s.probes >= 1 and s.resends == 1
        assert time.monotonic() - t0 < 10


async def test_connection_killed_mid_write(nfs_server: Server, testdir: str) -> None:
    """SS-13 / UL-27, killed exactly mid-WRITE: the server has received and run a WRITE, and the
    connection is cut the moment its reply reaches the proxy, before the client has it. The
    client binds a new connection (BIND_CONN_TO_SESSION, same session) and sends the WRITE
    again on the same slot and seqid; the server answers from its reply cache with the very
    reply that was lost. The WRITE ran exactly once: right after it ran, a local process put
    other bytes in its range on the server's disk, and they are still there at the end (running
    the WRITE again would have put the client's bytes back)."""
    files = ServerFiles(nfs_server.export_dir, getattr(nfs_server, "ceph_conf", None))
    size = min(4 << 20, nfs_server.max_file)
    data = os.urandom(size)
    cut: list[Reply] = []
    local: list[tuple[int, bytes]] = []

    def kill(reply: Reply, link: Link) -> Verdict:
        call = reply.call
        if cut or call is None or not call.has(nfs4.OP_WRITE) or call.args is None:
            return Verdict.FORWARD
        write = call.args.argarray[2].value
        assert isinstance(write, nfs4.WRITE4args)
        if write.offset < size // 2 or reply.res is None or reply.res.status != nfs4.NFS4_OK:
            return Verdict.FORWARD
        cut.append(reply)
        other = bytes(b ^ 0xFF for b in write.data[:64]) * (len(write.data) // 64 + 1)
        other = other[: len(write.data)]
        files.overwrite(f"{testdir}/w", write.offset, other)  # the WRITE has run: undo it
        local.append((write.offset, other))
        return Verdict.DROP_CONNECTION

    async with through_proxy(nfs_server, wsize=256 << 10, rsize=256 << 10) as (fs, proxy):
        await fs.mkdir(testdir)
        proxy.rules.append(Rule(on_reply=kill))
        await fs.write_bytes(f"{testdir}/w", data)
        assert len(cut) == 1, "no WRITE reply was cut"
        lost = cut[0]
        assert lost.call is not None
        # The same slot and seqid went out once more, on a new connection, and the server
        # answered it with the reply that was lost (its reply cache), not with a new one.
        again = [
            c
            for c in proxy.find(nfs4.OP_WRITE)
            if (c.slot, c.seqid) == (lost.call.slot, lost.call.seqid)
        ]
        assert len(again) == 2 and again[0] is lost.call
        assert again[1].conn != again[0].conn
        assert again[1].args is not None
        assert again[1].args.argarray[2].value == lost.call.args.argarray[2].value
        binds = proxy.find(nfs4.OP_BIND_CONN_TO_SESSION)
        assert binds and binds[0].conn == again[1].conn
        answer = [r for r in proxy.replies if r.call is again[1]]
        assert len(answer) == 1 and answer[0].res == lost.res
        s = fs.session.stats
        assert s.binds == 1 and s.sessions == 1 and s.clients == 1 and s.resends >= 1
        # Written exactly once: the local bytes put in after the WRITE ran are still there.
        offset, other = local[0]
        want = data[:offset] + other + data[offset + len(other) :]
        back = await fs.read_bytes(f"{testdir}/w")
        assert hashlib.sha256(back).digest() == hashlib.sha256(want).digest()
        assert files.read(f"{testdir}/w") == want
    files.close()


async def test_connection_killed_mid_rename_renames_once(nfs_server: Server, testdir: str) -> None:
    """SS-13: a RENAME that ran but whose reply was lost is answered from the reply cache on
    the same slot and seqid; it is not run twice (that would fail with NFS4ERR_NOENT)."""
    async with through_proxy(nfs_server) as (fs, proxy):
        await fs.mkdir(testdir)
        await fs.write_bytes(f"{testdir}/a", b"A")
        kill = once(lambda r: r.call is not None and r.call.has(nfs4.OP_RENAME))
        proxy.rules.append(Rule(on_reply=kill))
        await fs.rename(f"{testdir}/a", f"{testdir}/b")  # no FileNotFoundError
        renames = proxy.find(nfs4.OP_RENAME)
        assert len(renames) == 2
        assert (renames[0].slot, renames[0].seqid) == (renames[1].slot, renames[1].seqid)
        replies = [r for r in proxy.replies if r.call is renames[1]]
        assert replies and replies[0].res is not None and replies[0].res.status == nfs4.NFS4_OK
        assert sorted(await fs.listdir(testdir)) == ["b"]
        assert await fs.read_bytes(f"{testdir}/b") == b"A"


async def test_cancel_mid_read_releases_slots(nfs_server: Server, testdir: str) -> None:
    """TR-20 / UL-25: a read cancelled with READs in flight leaves no slot held and no call
    pending; the abandoned slots are probed before they are used again."""
    size = min(2 << 20, nfs_server.max_file)
    async with through_proxy(nfs_server, rsize=64 << 10, wsize=64 << 10, timeout=30.0) as (
        fs,
        proxy,
    ):
        await fs.mkdir(testdir)
        await fs.write_bytes(f"{testdir}/r", os.urandom(size))
        f = await fs.open(f"{testdir}/r", "rb")
        gate = asyncio.Event()

        def hold(reply: Reply, link: Link) -> Verdict:
            return (
                Verdict.SWALLOW
                if reply.call is not None and reply.call.has(nfs4.OP_READ) and not gate.is_set()
                else Verdict.FORWARD
            )

        proxy.rules.append(Rule(on_reply=hold))
        buf = _Buffer(size)
        released = weakref.ref(buf)
        reads_before = len(proxy.find(nfs4.OP_READ))
        task = asyncio.create_task(f.readinto(buf))
        # Eight READs reached the server and their replies were held back: eight slots busy.
        await proxy.until(
            lambda: len(proxy.find(nfs4.OP_READ)) - reads_before >= 8, what="8 READs in flight"
        )
        assert fs.session.slots.in_flight >= 8 and not task.done()
        task.cancel()
        await asyncio.wait([task])
        assert task.cancelled()
        gate.set()
        rpc = fs.session.rpc
        assert rpc is not None and not rpc.pending
        assert fs.session.slots.in_flight == 0
        del buf, task
        gc.collect()
        assert released() is None  # nothing holds on to the caller's buffer
        abandoned = [s for s in fs.session.slots.slots if s.needs_probe]
        assert len(abandoned) >= 8
        # Everything works afterwards, and the abandoned slots come back in step.
        await asyncio.gather(*(fs.stat(f"{testdir}/r") for _ in range(40)))
        assert fs.session.stats.slot_probes >= 1
        await f.seek(0)
        assert len(await f.read()) == size
        await f.close()
