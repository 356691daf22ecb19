"""SEQUENCE's status flags kept from one SEQUENCE to the next (issue 12): under random events
(sessions made and destroyed, connections bound, unbound and lost, callbacks failing,
BACKCHANNEL_CTL, the state layer's flags set and cleared, leases running out) the flags every
SEQUENCE reports, and every session's kept answer, equal the full computation
(``ServerSessions._status_flags``, RFC 8881 section 18.46.3)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.session.errors import SessionError
from nfsrdma.session.records import Session
from nfsrdma.session.server import ServerSessions
from nfsrdma.xdr.gen import nfs4

from .helpers import PRINCIPAL, Conn, cs, eid, make_sessions, seq

SECS: list[list[nfs4.callback_sec_parms4]] = [
    [],  # no callbacks
    [nfs4.callback_sec_parms4(0)],  # AUTH_NONE
    [nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "host", 0, 0, []))],  # AUTH_SYS
]
DIRS = [
    nfs4.CDFC4_FORE,
    nfs4.CDFC4_BACK,
    nfs4.CDFC4_FORE_OR_BOTH,
    nfs4.CDFC4_BACK_OR_BOTH,
]
FLAGS = [nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED, nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED]
CONNS = [Conn(f"c{i}") for i in range(4)]

small = st.integers(0, 7)
events = st.one_of(
    st.tuples(st.just("new"), small, st.booleans(), st.integers(0, 2), small),
    st.tuples(st.just("bind"), small, small, st.integers(0, 3)),
    st.tuples(st.just("lost"), small),
    st.tuples(st.just("fail"), small),
    st.tuples(st.just("ctl"), small, st.integers(0, 2)),
    st.tuples(st.just("destroy"), small, small),
    st.tuples(st.just("flags"), small, st.integers(0, 1), st.booleans()),
    st.tuples(st.just("seq"), small, small),
    st.tuples(st.just("reap"), st.integers(0, 200)),
)


class World:
    def __init__(self) -> None:
        self.s: ServerSessions = make_sessions()
        self.now = 0.0
        self.seqids: dict[bytes, int] = {}

    def live(self) -> list[Session]:
        return list(self.s.sessions.values())

    def pick(self, i: int) -> Session | None:
        live = self.live()
        return live[i % len(live)] if live else None

    def sequence(self, session: Session, conn: Conn) -> None:
        seqid = self.seqids.get(session.sessionid, 0) + 1
        result = self.s.sequence(
            seq(session.sessionid, seqid), conn=conn, now=self.now, op_count=2, request_size=200
        )
        self.seqids[session.sessionid] = seqid
        self.s.finish(result, None, self.now)
        assert result.status_flags == self.s._status_flags(session)

    def apply(self, event: tuple[Any, ...]) -> None:
        kind, *a = event
        s = self.s
        if kind == "new":
            owner, back, sec, conn = a
            r = s.exchange_id(eid(b"client-%d" % (owner % 3)), principal=PRINCIPAL, now=self.now)
            flags = nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN if back else 0
            s.create_session(
                cs(r.eir_clientid, r.eir_sequenceid, flags, sec=SECS[sec]),
                conn=CONNS[conn % len(CONNS)],
                principal=PRINCIPAL,
                now=self.now,
            )
            return
        if kind == "lost":
            s.connection_closed(CONNS[a[0] % len(CONNS)])
            return
        if kind == "reap":
            self.now += a[0]
            s.reap(self.now)
            return
        if kind == "flags":
            clients = [c for c in s.clients if c.confirmed]
            if clients:
                client = clients[a[0] % len(clients)]
                s.set_status_flags(client.clientid, FLAGS[a[1]], a[2])
            return
        session = self.pick(a[0])
        if session is None:
            return
        if kind == "bind":
            args = nfs4.BIND_CONN_TO_SESSION4args(session.sessionid, DIRS[a[2]], False)
            s.bind_conn_to_session(args, conn=CONNS[a[1] % len(CONNS)], now=self.now)
        elif kind == "fail":
            s.backchannel_failed(session)
        elif kind == "ctl":
            s.backchannel_ctl(session, session.cb_program, SECS[a[1]])
        elif kind == "destroy":
            s.destroy_session(
                session.sessionid, conn=CONNS[a[1] % len(CONNS)], current=None, last_op=True
            )
        elif kind == "seq":
            self.sequence(session, CONNS[a[1] % len(CONNS)])

    def check(self) -> None:
        for session in self.live():
            kept = session.seq_status_flags
            assert kept in (-1, self.s._status_flags(session)), (session, kept)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=1, max_size=60))
def test_kept_status_flags_always_equal_the_full_computation(script: list[tuple[Any, ...]]) -> None:
    world = World()
    for event in script:
        with suppress(SessionError):  # refused (too many connections...): nothing changed
            world.apply(event)
        world.check()
        for i, session in enumerate(world.live()):  # every session's answer kept, to be checked
            with suppress(SessionError):  # (a connection too many for the session)
                world.sequence(session, CONNS[i % len(CONNS)])
        world.check()


def test_a_failed_callback_is_reported_at_the_next_sequence() -> None:
    """The example behind the property: the flags kept by one SEQUENCE are not reported once
    the back channel failed, nor after a new binding repaired it."""
    world = World()
    world.apply(("new", 0, True, 1, 0))
    (session,) = world.live()
    world.sequence(session, CONNS[0])
    assert session.seq_status_flags == 0
    world.s.backchannel_failed(session)
    world.sequence(session, CONNS[0])
    down = nfs4.SEQ4_STATUS_CB_PATH_DOWN | nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
    assert session.seq_status_flags == down
    world.apply(("bind", 0, 1, 3))
    world.sequence(session, CONNS[0])
    assert session.seq_status_flags == 0
    world.s.connection_closed(CONNS[0])
    world.s.connection_closed(CONNS[1])
    world.sequence(session, CONNS[2])
    assert session.seq_status_flags == down
