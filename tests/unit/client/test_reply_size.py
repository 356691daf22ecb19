"""The client's reply-size bound (``session/client_replysize.py``, UL-3, TR-10): small COMPOUNDs
go over RPC-over-RDMA with no Reply chunk and no memory registered for their reply; large
replies (a big READDIR, a long symbolic link, extended attributes, attributes without a bound)
still get a Reply chunk; and a reply that does not fit what the bound provided for (ERR_CHUNK)
is fetched again on the same slot and seqid with a full Reply chunk, exactly once (UL-7,
UL-25). Against our server on the in-process verbs provider, as plain RPC-over-RDMA v1 (what
knfsd speaks) and with the rtrext extension."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.client import ops
from nfsrdma.client.attrs import STAT_ATTRS, encode_bitmap
from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.session import client as session_client
from nfsrdma.session.client import SEQUENCE_REPLY, ClientSession
from nfsrdma.session.client_replysize import (
    OPAQUE_LIMIT,
    RPC_REPLY_OVERHEAD,
    attr_bound,
    compound_reply_bound,
    op_reply_bound,
)
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions, connect_rdma
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

SERVER, CLIENT, PORT = "10.9.1.1", "10.9.1.2", 20049
PLAIN = RdmaOptions(rtrext=False)  # RPC-over-RDMA v1 only, as against knfsd
STATEID = nfs4.stateid4(1, b"s" * 12)


@asynccontextmanager
async def served(
    export: Path, rdma: RdmaOptions = PLAIN, **opts: Any
) -> AsyncIterator[tuple[NfsClient, list[RdmaConnection]]]:
    from nfsrdma.server import NFSServer

    fabric = InprocFabric()
    sdev, cdev = fabric.device(SERVER), fabric.device(CLIENT)
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=PORT, rdma_device=sdev,
        root_squash=False, lease_time=10,
    )  # fmt: skip
    await server.start()
    conns: list[RdmaConnection] = []

    async def connect() -> Connection:
        conn = await connect_rdma(cdev, SERVER, PORT, rdma)
        conns.append(conn)
        return conn

    opts.setdefault("uid", 0)
    opts.setdefault("gid", 0)
    session = ClientSession(connect, SessionOptions(**opts))
    try:
        await session.start()
        client = NfsClient(session, parse_url(f"rdma://{SERVER}/"))
        await client.mount()
        try:
            yield client, conns
        finally:
            await client.aclose()
    finally:
        await session.close()
        await server.close()


def counters(conns: list[RdmaConnection]) -> dict[str, int]:
    keys = ("reply_chunks", "registrations", "rtr_calls", "rdma_errors")
    return {k: sum(c.stats[k] for c in conns) for k in keys}


def grown(before: dict[str, int], conns: list[RdmaConnection]) -> dict[str, int]:
    after = counters(conns)
    return {k: after[k] - before[k] for k in after}


def resop_size(op: int, res: object) -> int:
    w = Writer()
    nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(op, res))
    return len(w.flatten())  # DDP items spliced back in


# -- the bound, operation by operation (each against the largest result it can have) -----------


def test_fixed_results_fit_their_bound() -> None:
    seq = nfs4.SEQUENCE4res(nfs4.NFS4_OK, nfs4.SEQUENCE4resok(b"i" * 16, 1, 2, 3, 4, 0xFFFFFFFF))
    assert resop_size(nfs4.OP_SEQUENCE, seq) + 4 == SEQUENCE_REPLY + 4 == 48
    cases: list[tuple[nfs4.nfs_argop4, int, object]] = [
        (
            ops.getfh(),
            nfs4.OP_GETFH,
            nfs4.GETFH4res(nfs4.NFS4_OK, nfs4.GETFH4resok(b"h" * nfs4.NFS4_FHSIZE)),
        ),
        (
            ops.lock(nfs4.WRITE_LT, 0, 1, lock_stateid=STATEID),
            nfs4.OP_LOCK,
            nfs4.LOCK4res(
                nfs4.NFS4ERR_DENIED,
                nfs4.LOCK4denied(0, 1, nfs4.WRITE_LT, nfs4.lock_owner4(7, b"o" * OPAQUE_LIMIT)),
            ),
        ),
        (
            ops.write(STATEID, 0, b"x" * 100, nfs4.UNSTABLE4),
            nfs4.OP_WRITE,
            nfs4.WRITE4res(nfs4.NFS4_OK, nfs4.WRITE4resok(100, nfs4.UNSTABLE4, b"v" * 8)),
        ),
        (
            ops.rename(b"a", b"b"),
            nfs4.OP_RENAME,
            nfs4.RENAME4res(
                nfs4.NFS4_OK,
                nfs4.RENAME4resok(nfs4.change_info4(True, 1, 2), nfs4.change_info4(True, 3, 4)),
            ),
        ),
        (
            ops.close(STATEID),
            nfs4.OP_CLOSE,
            nfs4.CLOSE4res(nfs4.NFS4_OK, STATEID),
        ),
    ]
    for argop, opnum, res in cases:
        bound = op_reply_bound(argop)
        assert bound is not None and resop_size(opnum, res) <= bound, opnum


def test_open_with_a_write_delegation_fits_its_bound() -> None:
    ace = nfs4.nfsace4(0, 0, 0, b"w" * OPAQUE_LIMIT)
    deleg = nfs4.open_delegation4(
        nfs4.OPEN_DELEGATE_WRITE,
        nfs4.open_write_delegation4(
            STATEID, True, nfs4.nfs_space_limit4(nfs4.NFS_LIMIT_SIZE, 1 << 40), ace
        ),
    )
    resok = nfs4.OPEN4resok(
        STATEID, nfs4.change_info4(True, 1, 2), 0xFFFFFFFF, [0xFFFFFFFF] * 3, deleg
    )
    owner = nfs4.state_owner4(1, b"me")
    bound = op_reply_bound(ops.open_(owner, 3, b"f", create=nfs4.UNCHECKED4))
    assert bound is not None
    assert resop_size(nfs4.OP_OPEN, nfs4.OPEN4res(nfs4.NFS4_OK, resok)) <= bound


def test_getattr_bound_counts_each_requested_attribute() -> None:
    bitmap = encode_bitmap(STAT_ATTRS)
    bound = attr_bound(bitmap)
    assert bound is not None
    # Two owner strings of OPAQUE_LIMIT, the rest fixed: well inside a 4 KiB inline reply.
    assert 2 * OPAQUE_LIMIT < bound < 3000
    stat = [ops.putfh(b"f" * 32), ops.getattr_(STAT_ATTRS)]
    total = compound_reply_bound(stat)
    assert total is not None and total + SEQUENCE_REPLY < 4096 - 64
    # A larger request is a larger bound; an attribute with no bound makes it unbounded.
    more = attr_bound(encode_bitmap((*STAT_ATTRS, nfs4.FATTR4_FILEHANDLE)))
    assert more is not None and more > bound
    for unbounded in (nfs4.FATTR4_ACL, nfs4.FATTR4_FS_LOCATIONS, nfs4.FATTR4_MIMETYPE):
        assert attr_bound(encode_bitmap((nfs4.FATTR4_SIZE, unbounded))) is None


def test_read_readdir_readlink_and_the_unbounded() -> None:
    read = ops.read(STATEID, 0, 10_000)
    inline = op_reply_bound(read)
    placed = op_reply_bound(read, write_chunk=True)
    assert inline is not None and placed is not None and inline - placed == 10_000
    readdir = ops.readdir(0, bytes(8), 8192, 32768, STAT_ATTRS)
    bound = op_reply_bound(readdir)
    assert bound is not None and 32768 < bound < 32768 + 64
    link = op_reply_bound(ops.readlink())
    assert link is not None and link > 4096
    for argop in (
        nfs4.nfs_argop4(nfs4.OP_SECINFO, nfs4.SECINFO4args(b"x")),
        nfs4.nfs_argop4(nfs4.OP_GETXATTR, nfs4.GETXATTR4args(b"user.x")),
        nfs4.nfs_argop4(nfs4.OP_READ_PLUS, nfs4.READ_PLUS4args(STATEID, 0, 10)),
    ):
        assert op_reply_bound(argop) is None
        assert compound_reply_bound([ops.putrootfh(), argop]) is None
    # Only the first READ-class result goes to the one Write chunk offered.
    two = compound_reply_bound([read, read], write_chunks=1)
    one = compound_reply_bound([read], write_chunks=1)
    assert two is not None and one is not None and two - one == inline
    # The RPC header, a verifier of any size and the echoed tag are counted.
    empty = compound_reply_bound([], b"tag!x")
    assert empty == RPC_REPLY_OVERHEAD + 4 + 4 + 8 + 4


# -- end to end over RPC-over-RDMA --------------------------------------------------------------


@pytest.mark.parametrize("rdma", [PLAIN, RdmaOptions()], ids=["v1", "rtrext"])
async def test_small_compounds_offer_no_reply_chunk_and_register_nothing(
    tmp_path: Path, rdma: RdmaOptions
) -> None:
    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"f{i}").write_bytes(b"x" * 100)
    async with served(tmp_path, rdma) as (fs, conns):
        await fs.stat("d/f0")  # the walk's handles are cached from here
        before = counters(conns)
        for i in range(5):
            st = await fs.stat(f"d/f{i}")
            assert st.st_size == 100
        assert await fs.exists("d/f1")
        await fs.chmod("d/f2", 0o600)
        res = await fs.session.compound([ops.putrootfh(), ops.getfh(), ops.getattr_(STAT_ATTRS)])
        assert res.status == nfs4.NFS4_OK
        # No Reply chunk, so no memory registered for the peer to write; nor receives held
        # for a continued reply (rtrext).
        assert grown(before, conns) == {
            "reply_chunks": 0,
            "registrations": 0,
            "rtr_calls": 0,
            "rdma_errors": 0,
        }
        assert fs.session.stats.reply_overruns == 0


@pytest.fixture
def shm_path() -> Iterator[Path]:
    """tmpfs (/dev/shm): it keeps many user extended attributes on one file."""
    d = Path(tempfile.mkdtemp(prefix="replysize-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def test_large_replies_still_get_a_reply_chunk(shm_path: Path) -> None:
    big = shm_path / "big"
    big.mkdir()
    names = sorted(f"{i:04d}-" + "n" * 120 for i in range(300))
    for n in names:
        (big / n).write_bytes(b"")
    target = "t" * 200 + "/" + "u" * 3800  # a link of 4001 octets
    os.symlink(target, shm_path / "ln")
    (shm_path / "x").write_bytes(b"")
    xnames = [f"attribute-{i:04d}" for i in range(200)]
    for n in xnames:
        os.setxattr(shm_path / "x", f"user.{n}", b"v")
    os.setxattr(shm_path / "x", "user.big", b"V" * 6000)
    async with served(shm_path) as (fs, conns):
        before = counters(conns)
        assert sorted(await fs.listdir("big")) == names  # ~40 KiB of READDIR replies
        assert await fs.readlink("ln") == target
        assert await fs.listxattr("x") == [*xnames, "big"] or sorted(
            await fs.listxattr("x")
        ) == sorted([*xnames, "big"])
        assert await fs.getxattr("x", "big") == b"V" * 6000
        # An attribute without a bound (an ACL: this server returns none) still works.
        fh = (await fs.session.compound([ops.putrootfh(), ops.getfh()])).resarray[-1]
        assert isinstance(fh.value, nfs4.GETFH4res) and fh.value.value is not None
        res = await fs.session.compound(
            [ops.putfh(fh.value.value.object), ops.getattr_((nfs4.FATTR4_SIZE, nfs4.FATTR4_ACL))]
        )
        assert res.status == nfs4.NFS4_OK
        delta = grown(before, conns)
        assert delta["reply_chunks"] >= 5 and delta["rdma_errors"] == 0
        assert fs.session.stats.reply_overruns == 0


# -- a bound that proves wrong: ERR_CHUNK, then the same slot and seqid with a full Reply chunk --


def _short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every estimate 200 octets: as if the server's reply were larger than expected."""
    monkeypatch.setattr(session_client, "compound_reply_bound", lambda *a, **k: 200)


async def test_an_underestimated_idempotent_call_is_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(200):
        (tmp_path / f"{i:04d}-{'n' * 60}").write_bytes(b"")
    async with served(tmp_path) as (fs, conns):
        _short_bound(monkeypatch)
        before = counters(conns)
        readdir = ops.readdir(0, bytes(8), 32768, 32768, (nfs4.FATTR4_FILEID,))
        res = await fs.session.compound([ops.putrootfh(), readdir])
        # The first reply did not fit inline (no Reply chunk was offered): ERR_CHUNK. The
        # server had run it without caching it (sa_cachethis false): the resend on the same
        # slot and seqid gets NFS4ERR_RETRY_UNCACHED_REP, and the request, idempotent, is sent
        # anew with a full Reply chunk.
        assert res.status == nfs4.NFS4_OK
        body = res.resarray[-1].value.value
        assert len(body.reply.entries) == 200
        assert fs.session.stats.reply_overruns == 1
        delta = grown(before, conns)
        assert delta["rdma_errors"] == 1 and delta["reply_chunks"] == 2
        # The slot table is in step: the next calls go through.
        assert (await fs.session.compound([ops.putrootfh()])).status == nfs4.NFS4_OK
        assert len(await fs.listdir("")) == 200


async def test_an_underestimated_cached_call_is_answered_from_the_reply_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-idempotent request (CREATE) whose reply did not fit: it ran once; the resend on
    the same slot and seqid is answered from the reply cache (sa_cachethis) through the Reply
    chunk, so the caller sees its CREATE succeed, not NFS4ERR_EXIST (exactly once)."""
    for i in range(200):
        (tmp_path / f"{i:04d}-{'n' * 60}").write_bytes(b"")
    async with served(tmp_path, max_response_size_cached=64 << 10) as (fs, conns):
        _short_bound(monkeypatch)
        before = counters(conns)
        readdir = ops.readdir(0, bytes(8), 32768, 32768, (nfs4.FATTR4_FILEID,))
        mkdir = ops.create(nfs4.NF4DIR, b"new", {nfs4.FATTR4_MODE: 0o755})
        res = await fs.session.compound(
            [ops.putrootfh(), mkdir, ops.putrootfh(), readdir], cachethis=True, idempotent=False
        )
        assert res.status == nfs4.NFS4_OK, res.status
        assert (tmp_path / "new").is_dir()
        assert fs.session.stats.reply_overruns == 1
        assert grown(before, conns)["rdma_errors"] == 1
        # Sent twice, run once: a CREATE run again would have failed with NFS4ERR_EXIST.
        again = await fs.session.compound([ops.putrootfh(), mkdir], cachethis=True)
        assert again.status == nfs4.NFS4ERR_EXIST


async def test_a_reply_that_overruns_the_full_reply_chunk_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resend is made once: an ERR_CHUNK to a call that already offered the largest Reply
    chunk is an error for the caller, and the session goes on."""
    for i in range(200):
        (tmp_path / f"{i:04d}-{'n' * 60}").write_bytes(b"")
    async with served(tmp_path) as (fs, conns):
        monkeypatch.setattr(ClientSession, "full_reply_size", lambda self: 300)
        _short_bound(monkeypatch)
        readdir = ops.readdir(0, bytes(8), 32768, 32768, (nfs4.FATTR4_FILEID,))
        with pytest.raises(OSError, match="refused"):
            await fs.session.compound([ops.putrootfh(), readdir])
        assert fs.session.stats.reply_overruns == 1
        assert counters(conns)["rdma_errors"] == 2
        monkeypatch.undo()
        assert (await fs.session.compound([ops.putrootfh()])).status == nfs4.NFS4_OK


async def test_a_server_that_drops_the_connection_on_an_overrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """knfsd drops the connection when a reply does not fit what the call offered, instead of
    answering ERR_CHUNK (docs/conform.md, UL-7.1). The call is resent on the same slot and seqid
    over a new connection, and from then on offers the full Reply chunk: its NFS4ERR_RETRY_
    UNCACHED_REP and the fresh request after it fit, instead of dropping connections forever."""
    from nfsrdma.transport.rdma.header import HeaderError
    from nfsrdma.transport.rdma.marshal import plan_reply
    from nfsrdma.transport.rdma.responder import Responder

    drops: list[int] = []
    send_reply = Responder.send_reply

    def like_knfsd(self: Responder, request: Any, msg: Writer) -> None:
        try:
            plan_reply(msg, request.context.header, self.send_limit)
        except HeaderError:
            drops.append(1)
            self.close()
            return
        send_reply(self, request, msg)

    monkeypatch.setattr(Responder, "send_reply", like_knfsd)
    for i in range(200):
        (tmp_path / f"{i:04d}-{'n' * 60}").write_bytes(b"")
    async with served(tmp_path) as (fs, conns):
        _short_bound(monkeypatch)
        readdir = ops.readdir(0, bytes(8), 32768, 32768, (nfs4.FATTR4_FILEID,))
        res = await asyncio.wait_for(fs.session.compound([ops.putrootfh(), readdir]), 30)
        assert res.status == nfs4.NFS4_OK
        assert len(res.resarray[-1].value.value.reply.entries) == 200
        assert drops == [1] and len(conns) == 2 and fs.session.stats.resends == 1
        assert (await fs.session.compound([ops.putrootfh()])).status == nfs4.NFS4_OK
