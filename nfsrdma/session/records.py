"""What the server keeps per client and per session (RFC 8881 sections 2.4, 2.10, 18.35.4).

A ``Client`` is the client record of 18.35.4 (owner, verifier, principal, client id, confirmed)
plus its lease, its CREATE_SESSION reply cache (one slot, 18.36.4) and its sessions.
A ``Session`` holds the negotiated channel attributes, the fore-channel slot table and reply
cache, the back-channel slot table, and the connections bound to it with their directions.
Connections are opaque hashable objects here (the RPC layer's ``RpcConnection`` in practice).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from nfsrdma.session.backchannel import BackchannelSlots
from nfsrdma.session.slots import SlotTable
from nfsrdma.xdr.gen import nfs4

FORE = 0x1  # channel_dir_from_server4 bits
BACK = 0x2
BOTH = FORE | BACK

AUTH_NONE = 0
AUTH_SYS = 1
CB_AUTH_NONE = nfs4.callback_sec_parms4(AUTH_NONE)


@dataclass(slots=True, eq=False)
class Client:
    clientid: int
    owner: bytes  # co_ownerid
    verifier: bytes  # co_verifier
    principal: Hashable
    created: float
    last_renewed: float  # lease renewal (for an unconfirmed record: its EXCHANGE_ID)
    confirmed: bool = False
    eia_flags: int = 0
    impl_id: list[nfs4.nfs_impl_id4] = field(default_factory=list)
    cs_seqid: int = 0  # the CREATE_SESSION slot: last csa_sequence accepted
    cs_reply: nfs4.CREATE_SESSION4resok | None = None  # ... and its result, for a replay
    sessions: dict[bytes, Session] = field(default_factory=dict)
    reclaim_complete: bool = False
    # SEQ4_STATUS_* bits set by the state layer (revoked state...): ``status_flags``
    _status_flags: int = 0
    removed: bool = False
    source: str = ""  # the source address its EXCHANGE_ID came from (shares.source_of)
    # Courtesy (``ServerSessions.reap``): the ``last_renewed`` of when the lease ran out with
    # state held; the client is courteous while it has not renewed since.
    courtesy_mark: float | None = None
    # The minor version of its EXCHANGE_ID: its callbacks' CB_COMPOUND carries the same (the
    # Linux client finds the session of a CB_SEQUENCE only within that minor version).
    minorversion: int = 1
    # SP4_MACH_CRED (RFC 8881 section 2.10.8.3): the principal that made the record, and the
    # operations only it may then send for this client (None: SP4_NONE)
    mach_cred: Hashable | None = None
    mach_ops: frozenset[int] = frozenset()

    @property
    def status_flags(self) -> int:
        return self._status_flags

    @status_flags.setter
    def status_flags(self, flags: int) -> None:
        self._status_flags = flags
        self.back_changed()

    def back_changed(self, session: Session | None = None) -> None:
        """Something SEQUENCE's status flags depend on changed (this record's flags, its set
        of sessions, or a session's back channel: ``session``, which may have left the
        record): every one of its sessions computes them again at its next SEQUENCE (a
        session's flags depend on the others': SEQ4_STATUS_CB_PATH_DOWN)."""
        for s in self.sessions.values():
            s.seq_status_flags = -1
        if session is not None:
            session.seq_status_flags = -1

    def add_session(self, session: Session) -> None:
        self.sessions[session.sessionid] = session
        self.back_changed(session)

    def drop_session(self, session: Session) -> None:
        self.sessions.pop(session.sessionid, None)
        self.back_changed(session)

    def lease_expired(self, now: float, lease_time: float) -> bool:
        return now - self.last_renewed > lease_time

    @property
    def courteous(self) -> bool:
        """Its lease ran out while it held state, which it keeps until someone conflicts."""
        return self.courtesy_mark is not None and self.courtesy_mark == self.last_renewed

    @property
    def busy(self) -> bool:
        """A COMPOUND is executing on one of its sessions."""
        return any(s.slots.busy for s in self.sessions.values())


@dataclass(slots=True, eq=False)
class Session:
    sessionid: bytes  # 16 random octets (SEC-11)
    client: Client
    fore: nfs4.channel_attrs4  # as negotiated
    back: nfs4.channel_attrs4
    flags: int  # csr_flags
    cb_program: int
    slots: SlotTable
    backchannel: BackchannelSlots
    created: float
    drc_reserved: int = 0  # bytes of the server's reply-cache budget held by this session
    drc_per_slot: int = 0  # ... per slot of its table
    drc_from_reserve: int = 0  # ... of which out of the reserve for minimal sessions
    source: str = ""  # the source address its CREATE_SESSION came from
    high_slots_used: float = 0.0  # when a slot above the minimal ones was last in use
    # Under reply-cache pressure (``shares.shed``): the slots the session is asked to make do
    # with (sr_target_highest_slotid + 1, CB_RECALL_SLOT), and when that was last sent.
    slot_cap: int | None = None
    slot_recall_sent: float = 0.0
    # conn -> FORE|BACK bits; changed through ``bind``, ``unbind`` and ``unbind_all`` only
    connections: dict[Hashable, int] = field(default_factory=dict)
    destroyed: bool = False
    # sr_status_flags as ``ServerSessions._status_flags`` computes them, kept from one SEQUENCE
    # to the next; -1: to be computed. Every change of what they depend on sets it back to -1
    # (``Client.back_changed``): the properties below, ``bind``/``unbind``/``unbind_all``, the
    # client record's ``status_flags`` and its sessions (``add_session``/``drop_session``).
    seq_status_flags: int = -1
    _cb_sec_parms: list[nfs4.callback_sec_parms4] = field(default_factory=list)
    _wants_back_channel: bool = False  # CONN_BACK_CHAN, a BACK binding or BACKCHANNEL_CTL seen
    _back_fault: bool = False  # a callback on the back channel failed; cleared by a new binding

    @property
    def cb_sec_parms(self) -> list[nfs4.callback_sec_parms4]:
        """csa_sec_parms / bca_sec_parms (replaced, never changed in place)."""
        return self._cb_sec_parms

    @cb_sec_parms.setter
    def cb_sec_parms(self, parms: list[nfs4.callback_sec_parms4]) -> None:
        self._cb_sec_parms = parms
        self.client.back_changed(self)

    @property
    def wants_back_channel(self) -> bool:
        return self._wants_back_channel

    @wants_back_channel.setter
    def wants_back_channel(self, wants: bool) -> None:
        self._wants_back_channel = wants
        self.client.back_changed(self)

    @property
    def back_fault(self) -> bool:
        return self._back_fault

    @back_fault.setter
    def back_fault(self, fault: bool) -> None:
        self._back_fault = fault
        self.client.back_changed(self)

    def bind(self, conn: Hashable, dirs: int) -> None:
        """``conn`` bound for the channels ``dirs`` (FORE|BACK bits)."""
        if dirs & BACK and not self.connections.get(conn, 0) & BACK:
            # Most recently bound last: callbacks go on the newest back connection.
            self.connections.pop(conn, None)
        self.connections[conn] = dirs
        self.client.back_changed(self)

    def unbind(self, conn: Hashable) -> None:
        if self.connections.pop(conn, None) is not None:
            self.client.back_changed(self)

    def unbind_all(self) -> None:
        self.connections.clear()
        self.client.back_changed(self)

    @property
    def clientid(self) -> int:
        return self.client.clientid

    @property
    def fore_connections(self) -> list[Hashable]:
        return [c for c, d in self.connections.items() if d & FORE]

    @property
    def back_connections(self) -> list[Hashable]:
        """Bound for the back channel, oldest first."""
        return [c for c, d in self.connections.items() if d & BACK]

    @property
    def back_path_up(self) -> bool:
        """Bound for callbacks, none failed since, and a flavour we can call with (an empty
        csa_sec_parms / BACKCHANNEL_CTL list, or only RPCSEC_GSS, means no callbacks)."""
        return (
            not self._back_fault
            and usable_cb_sec(self._cb_sec_parms) is not None
            and any(d & BACK for d in self.connections.values())
        )

    @property
    def cb_security(self) -> nfs4.callback_sec_parms4:
        """The credential to send callbacks with: the first AUTH_NONE / AUTH_SYS entry."""
        return usable_cb_sec(self.cb_sec_parms) or CB_AUTH_NONE


def usable_cb_sec(parms: list[nfs4.callback_sec_parms4]) -> nfs4.callback_sec_parms4 | None:
    for p in parms:
        if p.cb_secflavor in (AUTH_NONE, AUTH_SYS):
            return p
    return None
