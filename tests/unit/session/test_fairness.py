"""One client must not lock out the others (issue 9 hole 4, issue 11 section 5; SEC-12, SS-33).

Through the real COMPOUND path (compound.py, real RPC calls decoded from bytes): rates and the
reply-cache budget are shared per source address and per client owner, a newcomer always gets
a working session, idle slots are taken back and grow again when used. The policy is documented
in nfsrdma/session/shares.py and nfsrdma/session/ratelimit.py.

What is fair (decided here, documented there): a client already known to the server is never
held up by what others do at its address; a *new* owner at an address that spins EXCHANGE_ID
with ever new owners shares that address's fate (NFS4ERR_DELAY, retried), since the server can
tell the clients of one machine apart by nothing but the owner, which the attacker chooses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.nfs4 import compound as compound_module
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.errors import SessionError
from nfsrdma.session.ratelimit import KeyedBuckets
from nfsrdma.session.server import SLOT_OVERHEAD, ServerSessions, SessionCaps
from nfsrdma.session.shares import source_of
from nfsrdma.session.slots import Disposition, SlotTable
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.xdr.gen import nfs4

from .helpers import (
    PRINCIPAL,
    Reply,
    eid,
    op,
    op_create_session,
    op_exchange_id,
    op_sequence,
    resok,
)
from .test_ops_compound import Server

OK = nfs4.NFS4_OK
DELAY = nfs4.NFS4ERR_DELAY
UPD = nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A


class Clock:
    """The monotonic clock COMPOUND processing reads, stopped: rates refill only when a test
    moves it, so what is refused does not depend on how fast the machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(compound_module, "monotonic", fake.monotonic)
    return fake


def build(tmp_path: Path, caps: SessionCaps | None = None, **config: int) -> Server:
    export = tmp_path / "export"
    export.mkdir()
    vfs = LocalVfs(Export(root=str(export), state_dir=str(tmp_path / "state")))
    cfg = ServerConfig(**config)  # type: ignore[arg-type]
    srv = Server(None)  # type: ignore[arg-type]
    sessions = ServerSessions.from_config(cfg, on_client_expired=srv.expired.append, caps=caps)
    srv.state = ServerState(cfg, vfs, sessions, StateManager(vfs))
    return srv


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = build(tmp_path)  # the production defaults
    yield srv
    srv.state.close()


def at(srv: Server, host: str, port: int = 800) -> RpcConnection:
    """A connection from ``host`` (the peer the RPC layer reports)."""
    return srv.connection(f"{host}:{port}")


def op_update(owner: bytes, verifier: bytes = b"boot0001") -> nfs4.nfs_argop4:
    """EXCHANGE_ID updating one's own confirmed record (18.35.5 case 6)."""
    args = op_exchange_id(owner, verifier).value
    assert isinstance(args, nfs4.EXCHANGE_ID4args)
    args.eia_flags |= UPD
    return op(nfs4.OP_EXCHANGE_ID, args)


def op_big_session(clientid: int, sequence: int, cached: int = 65536) -> nfs4.nfs_argop4:
    """CREATE_SESSION asking for 64 slots with large cached replies."""
    args = op_create_session(clientid, sequence).value
    assert isinstance(args, nfs4.CREATE_SESSION4args)
    args.csa_fore_chan_attrs.ca_maxresponsesize_cached = cached
    args.csa_fore_chan_attrs.ca_maxrequests = 64
    return op(nfs4.OP_CREATE_SESSION, args)


async def exchange_id(
    srv: Server, conn: RpcConnection, owner: bytes
) -> tuple[int, nfs4.EXCHANGE_ID4resok | None]:
    res, _ = await srv.call(conn, [op_exchange_id(owner)])
    return res.status, resok(res, 0) if res.status == OK else None


async def mount(srv: Server, conn: RpcConnection, owner: bytes) -> nfs4.CREATE_SESSION4resok:
    """EXCHANGE_ID + CREATE_SESSION + a first SEQUENCE, each of which must succeed."""
    status, eir = await exchange_id(srv, conn, owner)
    assert status == OK and eir is not None, (owner, status)
    res, _ = await srv.call(conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert res.status == OK, (owner, res.status)
    csr: nfs4.CREATE_SESSION4resok = resok(res, 0)
    res, _ = await srv.call(conn, [op_sequence(csr.csr_sessionid, 1)])
    assert res.status == OK, (owner, res.status)
    return csr


# -- rates (hole 4a, issue 11 section 5) -------------------------------------------------------
async def test_exchange_id_spin_delays_only_the_spinning_address(server: Server) -> None:
    attacker = at(server, "192.0.2.66")
    known = at(server, "192.0.2.66", 801)
    await mount(server, known, b"known client at the attacker's address")
    delayed = 0
    for i in range(1500):  # ever new owners: each a new client record
        status, _ = await exchange_id(server, attacker, b"flood-%d" % i)
        assert status in (OK, DELAY)
        delayed += status == DELAY
        if i % 50 == 0:  # honest newcomers from other addresses, during the flood
            await mount(server, at(server, f"198.51.100.{i // 50}"), b"honest-%d" % i)
    assert delayed == 1500 - 511  # 512 at once, less the known client's record
    # The client the server already knows at that address is not held up either: an update
    # of its record and a second session pass.
    res, _ = await server.call(known, [op_update(b"known client at the attacker's address")])
    assert res.status == OK
    eir = resok(res, 0)
    res, _ = await server.call(known, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert res.status == OK
    # The flood is refused, for that address only. A new owner there shares its fate (the
    # server cannot tell it from one more flood owner); it retries after the DELAY.
    assert (await exchange_id(server, attacker, b"flood-more"))[0] == DELAY
    assert (await exchange_id(server, at(server, "192.0.2.66", 802), b"new there"))[0] == DELAY
    await mount(server, at(server, "203.0.113.7"), b"one more honest client")


async def test_one_owner_spinning_is_refused_without_starving_its_address(
    server: Server,
) -> None:
    attacker = at(server, "192.0.2.66")
    statuses = []
    for i in range(600):  # the same owner, a new verifier each time: case 4 over and over
        res, _ = await server.call(attacker, [op_exchange_id(b"spinner", b"boot%04d" % i)])
        statuses.append(res.status)
    # Sixteen at once (the clock stands still: no refill).
    assert statuses == [OK] * 16 + [DELAY] * 584
    # Another owner at the same address sets up at once: the spinner emptied its own bucket.
    await mount(server, at(server, "192.0.2.66", 900), b"neighbour")


async def test_setup_then_update_always_pass_for_an_honest_client(server: Server) -> None:
    """Issue 11 section 5: one EXCHANGE_ID, one CREATE_SESSION and an update of the record
    always pass, even when the address's bucket is emptied between them."""
    conn = at(server, "192.0.2.10")
    status, eir = await exchange_id(server, conn, b"honest")
    assert status == OK and eir is not None
    # Something else at the same address spins until it is refused.
    flood = at(server, "192.0.2.10", 999)
    i = 0
    while (await exchange_id(server, flood, b"noise-%d" % i))[0] == OK:
        i += 1
    res, _ = await server.call(conn, [op_create_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert res.status == OK
    sessionid = resok(res, 0).csr_sessionid
    res, _ = await server.call(conn, [op_update(b"honest")])
    assert res.status == OK
    assert resok(res, 0).eir_flags & nfs4.EXCHGID4_FLAG_CONFIRMED_R
    res, _ = await server.call(conn, [op_sequence(sessionid, 1)])
    assert res.status == OK


async def test_a_burst_of_300_setups_is_never_delayed(server: Server) -> None:
    # Three hundred clients behind one address (containers, NAT) ...
    for i in range(300):
        await mount(server, at(server, "192.0.2.1", 1000 + i), b"container-%d" % i)
    # ... and three hundred from as many addresses, all at once.
    for i in range(300):
        await mount(server, at(server, f"10.1.{i // 200}.{i % 200}"), b"host-%d" % i)
    assert len(server.sessions.sessions) == 600


def test_the_limiter_forgets_idle_keys_and_tracks_a_bounded_number() -> None:
    buckets: KeyedBuckets[str] = KeyedBuckets(rate=10, burst=5, max_keys=100)
    for i in range(1000):
        assert buckets.bucket(f"k{i}", now=0).allow(0)
        assert len(buckets) <= 100
    buckets.expire(now=0.05)  # not full again yet
    assert len(buckets) == 100
    buckets.expire(now=1.0)  # 0.5 s refills a bucket of 5 at 10/s
    assert len(buckets) == 0
    # Through the server: 5000 addresses spinning, the limiter holds at most its cap.
    s = ServerSessions(caps=SessionCaps(max_rate_keys=64, max_clients=100_000))
    for i in range(5000):
        s.exchange_id(eid(b"o%d" % i), principal=PRINCIPAL, now=0, source=f"10.9.{i}")
    assert len(s._creations.sources) <= 64 and len(s._creations.owners) <= 64


# -- the reply-cache budget (hole 4b) -----------------------------------------------------------
async def test_sixty_four_large_sessions_from_four_client_ids_leave_room_for_newcomers(
    tmp_path: Path, clock: Clock
) -> None:
    srv = build(tmp_path, slots=64, max_response_size_cached=65536, lease_time=30)
    sessions = srv.sessions
    attacker = at(srv, "192.0.2.66")
    attack: list[bytes] = []
    for n in range(4):
        status, eir = await exchange_id(srv, attacker, b"attacker-%d" % n)
        assert status == OK and eir is not None
        for k in range(16):
            res, _ = await srv.call(
                attacker, [op_big_session(eir.eir_clientid, eir.eir_sequenceid + k)]
            )
            assert res.status == OK  # granted, smaller when its shares are spent
            attack.append(resok(res, 0).csr_sessionid)
    # A newcomer from elsewhere gets all it asks for, and it works.
    conn = at(srv, "198.51.100.1")
    status, eir = await exchange_id(srv, conn, b"newcomer")
    assert status == OK and eir is not None
    res, _ = await srv.call(conn, [op_big_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert res.status == OK
    csr = resok(res, 0)
    assert csr.csr_fore_chan_attrs.ca_maxrequests == 64
    assert csr.csr_fore_chan_attrs.ca_maxresponsesize_cached == 65536
    res, _ = await srv.call(conn, [op_sequence(csr.csr_sessionid, 1, slot=63)])
    assert res.status == OK
    # A newcomer at the attacker's own address still gets a minimal, working session.
    conn = at(srv, "192.0.2.66", 4242)
    status, eir = await exchange_id(srv, conn, b"neighbour")
    assert status == OK and eir is not None
    res, _ = await srv.call(conn, [op_big_session(eir.eir_clientid, eir.eir_sequenceid)])
    assert res.status == OK
    small = resok(res, 0).csr_fore_chan_attrs
    assert small.ca_maxrequests == 4 and small.ca_maxresponsesize_cached == 4096
    res, _ = await srv.call(conn, [op_sequence(resok(res, 0).csr_sessionid, 1, slot=3)])
    assert res.status == OK
    # One address holds at most a quarter of the general pool (plus minimal sessions).
    drc = sessions.drc
    assert drc.by_source["192.0.2.66"] <= drc.pool // 4
    assert drc.reserved < drc.total // 2
    # When the attacker stops renewing, its leases expire (30 s + 15 s of slack) and its
    # reservations come back.
    expired = sessions.reap(clock.now + 30 + 15 + 1)
    assert len(expired) >= 4 and all(sessions.session(sid) is None for sid in attack)
    assert drc.by_source["192.0.2.66"] == 0 and drc.by_owner[b"attacker-0"] == 0
    assert drc.reserved == 0


async def test_idle_slots_are_taken_back_and_grow_again_when_used(
    tmp_path: Path, clock: Clock
) -> None:
    srv = build(tmp_path, slots=64, max_response_size_cached=8192)
    sessions = srv.sessions
    conn = at(srv, "192.0.2.5")
    csr = await mount(srv, conn, b"busy then idle")
    sid = csr.csr_sessionid
    per_slot = csr.csr_fore_chan_attrs.ca_maxresponsesize_cached + SLOT_OVERHEAD
    assert csr.csr_fore_chan_attrs.ca_maxrequests == 64
    res, _ = await srv.call(conn, [op_sequence(sid, 1, slot=40)])
    assert res.status == OK and resok(res, 0).sr_highest_slotid == 63
    full = sessions.drc_reserved
    # Not idle long enough: nothing changes.
    clock.now += 30
    sessions.reap(clock.now)
    assert sessions.drc_reserved == full
    # Sixty seconds without a slot above the first four.
    clock.now += 31
    sessions.reap(clock.now)
    assert sessions.drc_reserved == full - 60 * per_slot
    assert sessions.drc.by_owner[b"busy then idle"] == 4 * per_slot
    res, _ = await srv.call(conn, [op_sequence(sid, 2)])  # slot 0, sa_highest_slotid 0
    assert res.status == OK
    sr = resok(res, 0)
    assert (sr.sr_highest_slotid, sr.sr_target_highest_slotid) == (3, 3)
    res, _ = await srv.call(conn, [op_sequence(sid, 2, slot=40)])
    assert res.status == nfs4.NFS4ERR_BADSLOT
    # The client fills its four slots: the table grows back to what was negotiated.
    res, _ = await srv.call(conn, [op_sequence(sid, 1, slot=3)])
    assert res.status == OK
    sr = resok(res, 0)
    assert (sr.sr_highest_slotid, sr.sr_target_highest_slotid) == (63, 63)
    assert sessions.drc_reserved == full
    # A slot granted again starts afresh.
    res, _ = await srv.call(conn, [op_sequence(sid, 1, slot=40)])
    assert res.status == OK


async def test_slots_in_use_are_kept_and_idle_ones_taken_back(tmp_path: Path, clock: Clock) -> None:
    srv = build(tmp_path, slots=16)
    sessions = srv.sessions
    conn = at(srv, "192.0.2.5")
    sid = (await mount(srv, conn, b"steady")).csr_sessionid
    session = sessions.session(sid)
    assert session is not None
    for seqid in range(1, 4):  # used now and then: never 60 s without a high slot
        clock.now += 40
        res, _ = await srv.call(conn, [op_sequence(sid, seqid, slot=12)])
        assert res.status == OK
        sessions.reap(clock.now + 59)
        assert session.slots.count == 16
    start = clock.now
    # A request still executing on a high slot (SEQUENCE taken, the COMPOUND not finished)
    # keeps its slot however long it runs.
    args = nfs4.SEQUENCE4args(sid, 1, 9, 9, True)
    held = sessions.sequence(args, conn=conn, now=start, op_count=2, request_size=200)
    sessions.reap(start + 600)
    assert session.slots.count == 16
    sessions.finish(held, None, now=start + 600)
    sessions.reap(start + 600)
    assert session.slots.count == 4


# -- source keys -------------------------------------------------------------------------------
def test_source_keys() -> None:
    assert source_of("192.0.2.1:2049") == "192.0.2.1"
    assert source_of("::1:40000") == source_of("::1:40001") == "::/64"
    assert source_of("[2001:db8::5]:2049") == "2001:db8::/64"
    # A host has a whole /64: its addresses are one source.
    assert source_of("2001:db8::5:1") == source_of("2001:db8::ffff:2") == "2001:db8::/64"
    assert source_of("::ffff:192.0.2.1:99") == "192.0.2.1"
    assert source_of("rdma-peer") == "rdma-peer"


# -- the memory cap on client records ----------------------------------------------------------
def test_old_unconfirmed_records_make_room_first() -> None:
    s = ServerSessions(caps=SessionCaps(max_clients=20, max_clients_per_source=10))
    for i in range(10):  # an address at its share, with records nobody confirms
        s.exchange_id(eid(b"stale-%d" % i), principal=PRINCIPAL, now=0, source="192.0.2.66")
    # Young unconfirmed records are not evicted: the address waits.
    with pytest.raises(SessionError) as e:
        s.exchange_id(eid(b"x"), principal=PRINCIPAL, now=1, source="192.0.2.66")
    assert e.value.status == DELAY
    # Older than the grace: the oldest of that address goes, the newcomer gets a record.
    r = s.exchange_id(eid(b"x"), principal=PRINCIPAL, now=6, source="192.0.2.66")
    assert s.client(r.eir_clientid) is not None and len(s.clients) == 10
    assert s.clients.unconfirmed.get(b"stale-0") is None
    # Server-wide: another address fills the rest; then the oldest unconfirmed anywhere goes.
    for i in range(10):
        s.exchange_id(eid(b"b-%d" % i), principal=PRINCIPAL, now=7, source="198.51.100.1")
    assert len(s.clients) == 20
    s.exchange_id(eid(b"c"), principal=PRINCIPAL, now=7.5, source="203.0.113.1")
    assert len(s.clients) == 20 and s.clients.unconfirmed.get(b"stale-1") is None


def test_a_slot_table_gives_up_slots_with_their_replies_and_takes_new_ones_fresh() -> None:
    t = SlotTable(8, max_cached=1000)
    for slotid in (2, 6):
        slot, _ = t.classify(slotid, 1)
        t.begin(slot, 1)
        t.complete(slot, 1, Reply(300))
    busy, _ = t.classify(7, 1)
    t.begin(busy, 1)
    with pytest.raises(ValueError):
        t.resize(4)  # slot 7 is executing
    t.complete(busy, 1, None)
    t.resize(4)
    assert (t.highest_slotid, t.target_highest_slotid, t.cached_bytes) == (3, 3, 300)
    with pytest.raises(SessionError) as e:
        t.classify(6, 2)
    assert e.value.status == nfs4.NFS4ERR_BADSLOT
    t.resize(8)
    assert t.classify(6, 1)[1] is Disposition.NEW  # afresh: seqid 1 again
    assert t.classify(2, 1)[1] is Disposition.REPLAY  # kept slots keep their reply
