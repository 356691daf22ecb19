"""Restart, grace period and reclaim (RFC 8881 sections 8.4.2, 18.51.3; issue 11 section 2),
end to end through COMPOUND processing (compound.py: real RPC calls decoded from bytes, a real
LocalVfs, stable client records in a real state directory). A restart is one server state
dropped without cleaning up (as by kill -9) and another built on the same export and state
dir. COMPOUND's clock is stopped (``Clock``): time passes only when a test moves it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4 import compound as compound_module
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.context import ANONYMOUS_STATEID, Nfs4Error
from nfsrdma.nfs4.grace import Grace, MemoryStore
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.server import ServerSessions
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.vfs.clientdb import ClientDb
from nfsrdma.vfs.secret import StateDirError
from nfsrdma.xdr.gen import nfs4

from ..session.helpers import (
    op,
    op_create_session,
    op_exchange_id,
    op_reclaim_complete,
    op_sequence,
    resok,
    statuses,
)
from ..session.test_ops_compound import Server
from .test_io_ops import NOCREATE, open_op

OK = nfs4.NFS4_OK
GRACE = nfs4.NFS4ERR_GRACE
NO_GRACE = nfs4.NFS4ERR_NO_GRACE
BOTH = nfs4.OPEN4_SHARE_ACCESS_BOTH
LEASE = 30
EOF = 0xFFFFFFFFFFFFFFFF


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(compound_module, "monotonic", fake.monotonic)
    return fake


@dataclass
class Bed:
    """An export and a state dir, and the server instances started on them."""

    tmp: Path
    clock: Clock
    instances: list[Server] = field(default_factory=list)

    @property
    def export(self) -> Path:
        return self.tmp / "export"

    def db(self) -> ClientDb:
        return ClientDb.for_export(self.spec())

    def spec(self) -> Export:
        return Export(str(self.export), root_squash=False, state_dir=str(self.tmp / "state"))

    def start(self, grace_time: int | None = None) -> Server:
        """A server instance, wired as NFSServer.start wires it."""
        cfg = ServerConfig(lease_time=LEASE, grace_time=grace_time)
        export = self.spec()
        vfs = LocalVfs(export)
        sm = StateManager(vfs)
        grace = Grace(ClientDb.for_export(export), cfg.grace_seconds, self.clock.now)
        srv = Server(None)  # type: ignore[arg-type]

        def expired(clientid: int) -> None:
            srv.expired.append(clientid)
            sm.client_expired(clientid)
            grace.client_gone(clientid)

        sessions = ServerSessions.from_config(cfg, on_client_expired=expired)
        srv.state = ServerState(cfg, vfs, sessions, sm, grace=grace)
        self.instances.append(srv)
        return srv

    def crash(self, srv: Server) -> None:
        """The instance is gone: its memory, not the disk (its descriptors are closed)."""
        srv.state.close()
        self.instances.remove(srv)


@pytest.fixture
def bed(tmp_path: Path, clock: Clock) -> Iterator[Bed]:
    (tmp_path / "export").mkdir()
    b = Bed(tmp_path, clock)
    yield b
    for srv in list(b.instances):
        srv.state.close()


class Client:
    """One NFSv4.1 client (owner, client id, one session, slot 0) on one server instance."""

    def __init__(self, srv: Server, owner: bytes, verifier: bytes = b"boot0001") -> None:
        self.srv = srv
        self.owner = owner
        self.verifier = verifier
        self.conn: RpcConnection = srv.connection(owner.decode())
        self.seqid = 0
        self.sessionid = b""
        self.clientid = 0

    async def mount(self) -> Client:
        res, _ = await self.srv.call(self.conn, [op_exchange_id(self.owner, self.verifier)])
        assert res.status == OK
        eir = resok(res, 0)
        self.clientid = eir.eir_clientid
        ops = [op_create_session(eir.eir_clientid, eir.eir_sequenceid)]
        res, _ = await self.srv.call(self.conn, ops)
        assert res.status == OK
        self.sessionid = resok(res, 0).csr_sessionid
        return self

    async def call(self, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        self.seqid += 1
        res, _ = await self.srv.call(self.conn, [op_sequence(self.sessionid, self.seqid), *ops])
        return res

    async def expect(self, status: int, *ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
        res = await self.call(*ops)
        names = [nfs4.nfsstat4(s).name for s in statuses(res)]
        assert nfs4.nfsstat4(res.status).name == nfs4.nfsstat4(status).name, names
        return res

    async def reclaim_complete(self, status: int = OK) -> None:
        await self.expect(status, op_reclaim_complete())

    async def open(self, name: bytes, status: int = OK) -> tuple[bytes, nfs4.stateid4]:
        res = await self.expect(status, op(nfs4.OP_PUTROOTFH), open_op(name), op(nfs4.OP_GETFH))
        if status != OK:
            return b"", nfs4.stateid4(0, bytes(12))
        return resok(res, 3).object, resok(res, 2).stateid

    async def reopen(self, fh: bytes, status: int = OK) -> nfs4.stateid4:
        """OPEN with CLAIM_PREVIOUS of ``fh`` (a reclaim after the server's restart)."""
        claim = nfs4.open_claim4(nfs4.CLAIM_PREVIOUS, nfs4.OPEN_DELEGATE_NONE)
        res = await self.expect(status, putfh(fh), open_op(None, how=NOCREATE, claim=claim))
        return resok(res, 2).stateid if status == OK else nfs4.stateid4(0, bytes(12))

    async def lock(
        self,
        fh: bytes,
        open_sid: nfs4.stateid4,
        status: int = OK,
        reclaim: bool = False,
        owner: bytes = b"lock-owner",
    ) -> Any:
        locker = nfs4.locker4(
            True, nfs4.open_to_lock_owner4(0, open_sid, 0, nfs4.state_owner4(0, owner))
        )
        args = nfs4.LOCK4args(nfs4.WRITE_LT, reclaim, 0, EOF, locker)
        res = await self.expect(status, putfh(fh), op(nfs4.OP_LOCK, args))
        return resok(res, 2)

    async def write(self, fh: bytes, sid: nfs4.stateid4, offset: int, data: bytes) -> int:
        args = nfs4.WRITE4args(sid, offset, nfs4.FILE_SYNC4, data)
        res = await self.call(putfh(fh), op(nfs4.OP_WRITE, args))
        return res.status


def putfh(fh: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))


def status_name(status: int) -> str:
    return nfs4.nfsstat4(status).name


# ---------------------------------------------------------------- the whole story


async def test_restart_reclaim_open_and_lock_then_carry_on(bed: Bed, clock: Clock) -> None:
    """A client holding an open and a lock: the server restarts; in grace the client reclaims
    both (OPEN CLAIM_PREVIOUS by handle, LOCK with reclaim set), RECLAIM_COMPLETE ends grace
    early (it was the only recorded client), and it carries on writing; the reclaimed lock
    still refuses another client. Meanwhile other OPENs got NFS4ERR_GRACE, an unknown client's
    reclaim NFS4ERR_NO_GRACE."""
    first = bed.start()
    a = await Client(first, b"client-a").mount()
    await a.reclaim_complete()
    assert bed.db().load() == {b"client-a"}
    fh, sid = await a.open(b"f")
    assert status_name(await a.write(fh, sid, 0, b"before ")) == "NFS4_OK"
    await a.lock(fh, sid)

    bed.crash(first)
    clock.now += 1
    second = bed.start()
    assert second.state.grace.in_grace(clock.now)
    a2 = await Client(second, b"client-a").mount()
    # The old stateid belongs to the dead instance.
    assert status_name(await a2.write(fh, sid, 7, b"x")) == "NFS4ERR_STALE_STATEID"
    stranger = await Client(second, b"client-b").mount()
    await stranger.reopen(fh, NO_GRACE)  # no record of it: nothing to reclaim
    await stranger.reclaim_complete()
    await stranger.open(b"g", GRACE)  # new state in grace
    await a2.open(b"h", GRACE)  # even for a client that may reclaim
    # Reclaims by the recorded client re-create its state.
    sid2 = await a2.reopen(fh)
    await a2.lock(fh, sid2, reclaim=True)
    assert second.state.grace.in_grace(clock.now)
    await a2.reclaim_complete()
    assert not second.state.grace.in_grace(clock.now)  # every recorded client is back
    grace = second.state.grace
    assert (grace.ended_why, grace.reclaimed_opens, grace.reclaimed_locks) == (
        "every client reclaimed",
        1,
        1,
    )
    await a2.reopen(fh, NO_GRACE)  # reclaims are over
    assert status_name(await a2.write(fh, sid2, 7, b"after")) == "NFS4_OK"
    assert (bed.export / "f").read_bytes() == b"before after"
    gfh, gsid = await stranger.open(b"f")  # share modes allow it ...
    denied = await stranger.lock(gfh, gsid, nfs4.NFS4ERR_DENIED)  # ... the reclaimed lock not
    assert denied.owner.clientid == a2.clientid
    assert bed.db().load() == {b"client-a", b"client-b"}


async def test_grace_period_runs_out(bed: Bed, clock: Clock) -> None:
    """Two recorded clients, one comes back: grace lasts grace_time; in it new opens and
    special-stateid I/O get NFS4ERR_GRACE; after it the late client's reclaim gets
    NFS4ERR_NO_GRACE and its record is forgotten."""
    first = bed.start()
    a = await Client(first, b"client-a").mount()
    await a.reclaim_complete()
    await (await Client(first, b"client-b").mount()).reclaim_complete()
    fh, _ = await a.open(b"f")
    bed.crash(first)

    second = bed.start(grace_time=20)
    a2 = await Client(second, b"client-a").mount()
    await a2.reclaim_complete()
    assert second.state.grace.in_grace(clock.now)  # client-b may still come back
    await a2.open(b"new", GRACE)
    anon_write = nfs4.WRITE4args(ANONYMOUS_STATEID, 0, nfs4.FILE_SYNC4, b"x")
    await a2.expect(GRACE, putfh(fh), op(nfs4.OP_WRITE, anon_write))
    size = nfs4.fattr4(bitmap_of([nfs4.FATTR4_SIZE]), (0).to_bytes(8, "big"))
    truncate = op(nfs4.OP_SETATTR, nfs4.SETATTR4args(ANONYMOUS_STATEID, size))
    await a2.expect(GRACE, putfh(fh), truncate)
    clock.now += 19
    await a2.open(b"new", GRACE)
    clock.now += 1
    await a2.open(b"new")  # grace is over
    await a2.expect(OK, putfh(fh), op(nfs4.OP_WRITE, anon_write))
    b2 = await Client(second, b"client-b").mount()
    await b2.reopen(fh, NO_GRACE)  # too late
    assert bed.db().load() == {b"client-a"}


def test_grace_runs_from_when_the_server_serves(tmp_path: Path) -> None:
    """RFC 8881 section 8.4.2: the previous clients get the whole period to reclaim, however
    long the restart took before connections were accepted (``serving``); a first start, with
    no records, has no period to move."""
    grace = Grace(MemoryStore([b"client-a"]), 10, 100.0)
    grace.serving(108.0)  # eight seconds of start-up
    assert grace.own_grace(117.9)
    assert not grace.own_grace(118.0) and grace.ended_why == "time is up"
    first = Grace(MemoryStore(), 10, 100.0)
    first.serving(108.0)
    assert not first.own_grace(108.0) and first.ended_why == "no clients to reclaim"


def test_grace_waits_once_for_a_client_still_reclaiming() -> None:
    """Time up while a client that came back has reclaims accepted but no RECLAIM_COMPLETE
    yet: the period goes on, once, to twice the grace time from its start; its reclaims are
    still accepted meanwhile, and its RECLAIM_COMPLETE ends the period when it was the last."""
    grace = Grace(MemoryStore([b"client-a"]), 10, 0.0)
    grace.serving(5.0)
    grace.check_reclaim(b"client-a", False, 14.0)  # an OPEN CLAIM_PREVIOUS
    assert grace.own_grace(15.0)  # time is up at 15: extended to 25
    grace.check_reclaim(b"client-a", False, 20.0)  # a LOCK reclaim: still accepted
    assert grace.own_grace(24.9)
    grace.reclaim_complete(1, b"client-a", 21.0)
    assert not grace.own_grace(21.0) and grace.ended_why == "every client reclaimed"


def test_grace_extends_only_for_a_reclaim_in_progress() -> None:
    """No extension for clients that never came back or already completed, and only one:
    at twice the grace time the period ends even if a client is still reclaiming."""
    idle = Grace(MemoryStore([b"client-a", b"client-b"]), 10, 0.0)
    idle.check_reclaim(b"client-a", False, 1.0)
    idle.reclaim_complete(1, b"client-a", 2.0)  # client-b never comes back
    assert not idle.own_grace(10.0) and idle.ended_why == "time is up"
    slow = Grace(MemoryStore([b"client-a"]), 10, 0.0)
    slow.check_reclaim(b"client-a", False, 9.0)
    assert slow.own_grace(19.9)
    assert not slow.own_grace(20.0) and slow.ended_why == "time is up"
    with pytest.raises(Nfs4Error) as e:
        slow.check_reclaim(b"client-a", False, 20.5)
    assert e.value.status == nfs4.NFS4ERR_NO_GRACE


async def test_18_51_3_new_client_id_needs_reclaim_complete(bed: Bed) -> None:
    """A first start has no grace period, yet a client ID that has not sent RECLAIM_COMPLETE
    gets NFS4ERR_GRACE for a non-reclaim OPEN or LOCK (RFC 8881 section 18.51.3); its
    reclaims get NFS4ERR_NO_GRACE."""
    srv = bed.start()
    assert not srv.state.grace.in_grace(1000.0)
    early = await Client(srv, b"early").mount()
    await early.open(b"f", GRACE)
    await early.reclaim_complete()
    fh, sid = await early.open(b"f")
    await early.lock(fh, sid)
    late = await Client(srv, b"late").mount()
    await late.reopen(fh, NO_GRACE)
    # The client restarted (a new verifier: a new client ID, its state gone): before its
    # RECLAIM_COMPLETE a LOCK is refused before anything else is looked at.
    rebooted = await Client(srv, b"early", verifier=b"boot0002").mount()
    assert rebooted.clientid != early.clientid
    await rebooted.lock(fh, sid, GRACE)
    await rebooted.lock(fh, sid, NO_GRACE, reclaim=True)
    await rebooted.reclaim_complete()
    fh, sid = await rebooted.open(b"f")
    await rebooted.lock(fh, sid)


async def test_record_goes_with_the_client(bed: Bed) -> None:
    """DESTROY_CLIENTID removes the record: the next start has no grace period."""
    srv = bed.start()
    c = await Client(srv, b"leaving").mount()
    await c.reclaim_complete()
    assert bed.db().load() == {b"leaving"}
    res, _ = await srv.call(
        c.conn, [op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(c.sessionid))]
    )
    assert res.status == OK
    res, _ = await srv.call(
        c.conn, [op(nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(c.clientid))]
    )
    assert res.status == OK
    assert bed.db().load() == set()
    bed.crash(srv)
    again = bed.start()
    assert not again.state.grace.in_grace(1000.0)
    late = await Client(again, b"leaving").mount()
    await late.reopen(again.state.vfs.root_handle(), NO_GRACE)


# ---------------------------------------------------------------- the records on disk


def test_client_db_is_private_atomic_and_checked(tmp_path: Path) -> None:
    db = ClientDb(str(tmp_path / "state" / "clients.json"))
    assert db.load() == set()
    db.save({b"a", b"\xff\x00"})
    assert db.load() == {b"a", b"\xff\x00"}
    st = os.stat(db.path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert json.loads(Path(db.path).read_text())["clients"] == ["61", "ff00"]
    assert sorted(os.listdir(tmp_path / "state")) == ["clients.json"]  # no temporary left
    Path(db.path).write_text('{"clients": 7}')
    with pytest.raises(StateDirError):
        db.load()
    os.chmod(db.path, 0o644)
    with pytest.raises(StateDirError) as e:
        db.load()
    assert e.value.errno in (0, errno.EPERM)
