"""The server's session registry (RFC 8881 sections 2.4, 2.10, 18.33-18.37, 18.46, 18.49-18.51).

``ServerSessions`` is pure: operations take their decoded arguments, the connection they came on
(an opaque hashable: the RPC layer's ``RpcConnection``) and the clock (``now``, monotonic
seconds), and return results or raise ``SessionError``. The NFSv4.1 operation handlers in
``nfsrdma.nfs4.ops.session_ops`` are thin glue; COMPOUND processing calls ``sequence`` through
SEQUENCE and ``finish`` when the COMPOUND is done; the server calls ``connection_closed`` and,
periodically, ``reap``.

State protection: SP4_NONE, where a SEQUENCE on a connection not yet bound to its session binds
it to the fore channel (SS-12, 18.34.3), and SP4_MACH_CRED once the EXCHANGE_ID came with an
RPCSEC_GSS principal (2.10.8.3, 18.35.3): CREATE_SESSION, DESTROY_SESSION, DESTROY_CLIENTID and
BIND_CONN_TO_SESSION for that client are then refused (NFS4ERR_ACCESS) to any other principal,
and a connection must be bound explicitly (NFS4ERR_CONN_NOT_BOUND_TO_SESSION).

Resource bounds (SEC-12, SS-33): client records and sessions are capped, their creation is rate
limited, and every session reserves slots x ca_maxresponsesize_cached of a server-wide reply
cache budget (fewer slots are granted when the budget runs low). All of these are shared out per
source address and per client owner, a newcomer always gets at least a minimal session, idle
slots are taken back, and under reply-cache pressure the sessions most above their fair share
are asked for slots back (sr_target_highest_slotid; CB_RECALL_SLOT, which the server sends for
the ``SlotRecall`` actions given to ``on_slot_recall``): the policy and its numbers are in
``nfsrdma.session.shares`` and ``nfsrdma.session.ratelimit``. Unconfirmed records and clients whose lease expired are reaped.

Courteous expiry (RFC 8881 section 8.3 lets a server keep an expired client's state; knfsd does
since Linux 5.19). A confirmed client whose lease ran out while it held open or lock state is not
dropped: from the moment its lease has run out it is *courteous*, keeping its record, its
sessions and its state. If it comes back (any SEQUENCE, or EXCHANGE_ID, renews the lease) it
carries on as if nothing happened.
If another client's request conflicts with its state first, the state layer calls
``expire_courteous``: the client is then expired at once, exactly as a lease expiry without
courtesy would (sessions destroyed, record removed, all its state released), and the conflicting
request goes ahead in the same COMPOUND. Coming back later, it finds its client ID expired, the
RFC's answer for a client whose lease ran out (section 8.3): SEQUENCE on its old session gets
NFS4ERR_BADSESSION, CREATE_SESSION or DESTROY_CLIENTID with its client ID NFS4ERR_STALE_CLIENTID,
and it recovers through EXCHANGE_ID as after a lease loss. (Revoking only the conflicting state and
reporting SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED, section 18.46.3, was the alternative; expiring
the whole client is what knfsd does, needs no revoked-stateid bookkeeping, and every client
already handles it.) Courtesy is bounded: a courteous client is expired after ``courtesy_time``
(24 h, as knfsd), the oldest courteous clients beyond ``max_courteous_clients`` are expired, and
a courteous client is evicted to make room when the client-record cap is reached.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from nfsrdma.session.backchannel import BackchannelSlots
from nfsrdma.session.channels import (
    MIN_SERVER_REQUEST_SIZE,
    ForeLimits,
    negotiate_back,
    negotiate_fore,
)
from nfsrdma.session.errors import SessionError
from nfsrdma.session.ratelimit import CreationLimiter
from nfsrdma.session.records import BACK, BOTH, FORE, Client, Session, usable_cb_sec
from nfsrdma.session.registry import ClientRegistry
from nfsrdma.session.shares import DrcPressure, ReplyCacheBudget, SlotHolding, Tally, shed
from nfsrdma.session.slots import SEQID_MASK, CachedReply, Disposition, Slot, SlotTable
from nfsrdma.xdr.gen import nfs4

__all__ = [
    "Client",
    "SequenceResult",
    "ServerSessions",
    "Session",
    "SessionCaps",
    "SessionConfig",
    "SessionError",
    "SlotRecall",
]

log = logging.getLogger("nfsrdma.session")

MiB = 1 << 20

EIA_FLAGS_ALLOWED = (
    nfs4.EXCHGID4_FLAG_SUPP_MOVED_REFER
    | nfs4.EXCHGID4_FLAG_SUPP_MOVED_MIGR
    | nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID
    | nfs4.EXCHGID4_FLAG_MASK_PNFS
    | nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A
)
CSA_FLAGS_KNOWN = (
    nfs4.CREATE_SESSION4_FLAG_PERSIST
    | nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    | nfs4.CREATE_SESSION4_FLAG_CONN_RDMA
)
SLOT_OVERHEAD = 256  # bytes per slot charged to the reply-cache budget besides its reply
IMPL_DOMAIN = b"nfsrdma.invalid"

_DIRECTIONS = {
    nfs4.channel_dir_from_client4.CDFC4_FORE: FORE,
    nfs4.channel_dir_from_client4.CDFC4_BACK: BACK,
    nfs4.channel_dir_from_client4.CDFC4_FORE_OR_BOTH: BOTH,
    nfs4.channel_dir_from_client4.CDFC4_BACK_OR_BOTH: BOTH,
}


class SessionConfig(Protocol):
    """The ServerConfig fields the session layer uses."""

    @property
    def lease_time(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def max_request_size(self) -> int: ...
    @property
    def max_response_size(self) -> int: ...
    @property
    def max_response_size_cached(self) -> int: ...
    @property
    def max_operations(self) -> int: ...
    @property
    def back_slots(self) -> int: ...
    @property
    def server_owner(self) -> bytes: ...
    @property
    def server_scope(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class SessionCaps:
    """Bounds on what clients can make the server hold (SEC-12), and their fair shares (the
    reasons for the numbers are in ``nfsrdma.session.shares`` and ``nfsrdma.session.ratelimit``)."""

    max_clients: int = 4096  # client records, confirmed and unconfirmed (memory)
    max_clients_per_source: int = 1024
    unconfirmed_grace: float = 5.0  # an unconfirmed record this young is not evicted for room
    max_sessions: int = 2048
    max_sessions_per_source: int = 512
    max_sessions_per_client: int = 16
    max_connections_per_session: int = 64
    # Creations: new client records per owner and per address, sessions of confirmed clients
    # per owner (the CREATE_SESSION that confirms a record is paid for by its EXCHANGE_ID).
    owner_rate: float = 1.0
    owner_burst: float = 16.0
    source_rate: float = 64.0
    source_burst: float = 512.0
    max_rate_keys: int = 8192  # owners and addresses tracked by the limiter, each
    drc_budget: int = 256 * MiB  # reply cache, all sessions together
    drc_source_share: float = 1 / 4  # of the general pool (the budget less the reserve)
    drc_owner_share: float = 1 / 16
    min_slots: int = 4  # a minimal session: always granted while sessions may be created ...
    min_cached: int = 4096  # ... with cached replies of at most this size
    slot_idle_time: float = 60.0  # slots above the minimal ones unused this long are taken back
    drc_high_water: float = 0.9  # of the pool: reserved beyond this, slots are recalled ...
    drc_low_water: float = 0.75  # ... until below this, when recalled slots grow back
    courtesy_time: float = 24 * 3600.0  # a courteous client is expired this long after its lease
    max_courteous_clients: int = 1024  # beyond this, the longest-expired ones are expired

    @property
    def min_session_cost(self) -> int:
        return self.min_slots * (self.min_cached + SLOT_OVERHEAD)


@dataclass(frozen=True, slots=True)
class SlotRecall:
    """An action of the pressure decision for the server to carry out: CB_RECALL_SLOT
    (RFC 8881 section 20.8) on the back channel of session ``sessionid`` of ``clientid``."""

    clientid: int
    sessionid: bytes
    target_highest_slotid: int


@dataclass(slots=True, eq=False)
class SequenceResult:
    """What SEQUENCE found: the session and slot this COMPOUND holds (when ``replay`` is None
    and ``uncached_retry`` is false), or the retry to answer; with the values of its
    SEQUENCE4resok (``resok``, made when asked: the COMPOUND fast path packs them directly)."""

    session: Session
    slot: Slot
    seqid: int
    slotid: int
    highest_slotid: int  # sr_highest_slotid
    target_highest_slotid: int  # sr_target_highest_slotid
    status_flags: int  # sr_status_flags
    cachethis: bool = False
    replay: object | None = None  # the cached reply of the request this one retries
    uncached_retry: bool = False  # a retry whose reply was not cached

    @property
    def resok(self) -> nfs4.SEQUENCE4resok:
        return nfs4.SEQUENCE4resok(  # (sr_ fields in order: positional is cheaper)
            self.session.sessionid,
            self.seqid,
            self.slotid,
            self.highest_slotid,
            self.target_highest_slotid,
            self.status_flags,
        )


class ServerSessions:
    def __init__(
        self,
        *,
        lease_time: float = 90,
        slots: int = 64,
        max_request_size: int = MiB + 16 * 1024,
        max_response_size: int = MiB + 16 * 1024,
        max_response_size_cached: int = 64 * 1024,
        max_operations: int = 64,
        back_slots: int = 4,
        server_owner: bytes = b"",
        server_scope: bytes = b"",
        on_client_expired: Callable[[int], None] | None = None,
        has_state: Callable[[int], bool] | None = None,
        caps: SessionCaps | None = None,
        on_slot_recall: Callable[[SlotRecall], None] | None = None,
        lease_slack: float | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        if max_request_size < MIN_SERVER_REQUEST_SIZE:
            raise ValueError(f"max_request_size below {MIN_SERVER_REQUEST_SIZE}")
        if slots < 1 or max_operations < 2:
            raise ValueError("a session needs at least one slot and two operations")
        self.lease_time = float(lease_time)
        # A client is reaped this long after its lease ran out (clocks and networks are slow).
        self.lease_slack = lease_time / 2 if lease_slack is None else lease_slack
        self.fore_limits = ForeLimits(
            max_request_size,
            max_response_size,
            max_response_size_cached,
            max_operations,
            slots,
        )
        self.max_request_size = max_request_size
        self.back_slots = back_slots
        host = socket.gethostname().encode()
        self.server_owner = server_owner or b"nfsrdma:" + host
        self.server_scope = server_scope or host
        self.impl_id = nfs4.nfs_impl_id4(
            IMPL_DOMAIN, f"nfsrdma {_version()}".encode(), nfs4.nfstime4(0, 0)
        )
        self.on_client_expired = on_client_expired or (lambda clientid: None)
        self.has_state = has_state or (lambda clientid: False)
        self.caps = caps or SessionCaps()
        self.random_bytes = random_bytes
        self.clients = ClientRegistry(random_bytes)
        self.sessions: dict[bytes, Session] = {}
        self._conn_sessions: dict[Hashable, set[bytes]] = {}
        caps = self.caps
        self._creations = CreationLimiter(
            owner_rate=caps.owner_rate,
            owner_burst=caps.owner_burst,
            source_rate=caps.source_rate,
            source_burst=caps.source_burst,
            max_keys=caps.max_rate_keys,
        )
        self.drc = ReplyCacheBudget(
            caps.drc_budget,
            reserve=(caps.max_sessions + 1) * caps.min_session_cost,
            source_share=caps.drc_source_share,
            owner_share=caps.drc_owner_share,
        )
        self._source_sessions: Tally[str] = Tally()
        self.pressure = DrcPressure(caps.drc_high_water, caps.drc_low_water)
        # Carries out the CB_RECALL_SLOTs the pressure decision returns (``nfs4.callback``).
        self.on_slot_recall = on_slot_recall or (lambda recall: None)
        self.slot_recalls = 0
        self.now = 0.0  # the latest clock reading seen (requests, reap): for ``courteous``

    @classmethod
    def from_config(
        cls,
        config: SessionConfig,
        on_client_expired: Callable[[int], None] | None = None,
        **kwargs: object,
    ) -> ServerSessions:
        return cls(
            lease_time=config.lease_time,
            slots=config.slots,
            max_request_size=config.max_request_size,
            max_response_size=config.max_response_size,
            max_response_size_cached=config.max_response_size_cached,
            max_operations=config.max_operations,
            back_slots=config.back_slots,
            server_owner=config.server_owner,
            server_scope=config.server_scope,
            on_client_expired=on_client_expired,
            **kwargs,  # type: ignore[arg-type]
        )

    # -- lookups and hooks for other parts of the server ----------------------------------
    def session(self, sessionid: bytes) -> Session | None:
        return self.sessions.get(sessionid)

    def client(self, clientid: int) -> Client | None:
        return self.clients.get(clientid)

    def callback_path(
        self, clientid: int, sessionid: bytes | None = None
    ) -> tuple[Session, Hashable] | None:
        """A session of the client (that one, when ``sessionid`` is given) with a working back
        channel, and the connection to send its callbacks on (the most recently bound); None
        when there is none (SS-26: then the server must not hand out recallable state)."""
        client = self.clients.get(clientid)
        if client is None or not client.confirmed:
            return None
        for session in reversed(list(client.sessions.values())):
            if sessionid is not None and session.sessionid != sessionid:
                continue
            if session.back_path_up and session.backchannel.count:
                return session, session.back_connections[-1]
        return None

    def backchannel_failed(self, session: Session) -> None:
        """A callback got no answer: report the path down until the client binds again."""
        session.back_fault = True

    def set_status_flags(self, clientid: int, flags: int, on: bool = True) -> None:
        """Set (or clear) SEQ4_STATUS_* bits reported to the client in every SEQUENCE, e.g.
        SEQ4_STATUS_RECALLABLE_STATE_REVOKED while revoked delegations are not freed."""
        client = self.clients.get(clientid)
        if client is not None:
            client.status_flags = (
                client.status_flags | flags if on else client.status_flags & ~flags
            )

    def courteous(self, clientid: int) -> bool:
        """Is the client courteous: its lease ran out (by the clock of the latest request or
        reap, ``now``) while it holds state, kept until someone conflicts, and nothing of it is
        executing?"""
        client = self.clients.get(clientid)
        if client is None or not client.confirmed:
            return False
        if client.courteous:
            return True
        expired = not client.busy and client.lease_expired(self.now, self.lease_time)
        return expired and self.has_state(clientid)

    def expire_courteous(self, clientid: int) -> bool:
        """Another client's request conflicts with this courteous client's state: expire it
        now (its state is released through ``on_client_expired``). False if the client is
        not courteous (it renewed its lease, or is gone): then nothing is done."""
        client = self.clients.get(clientid)
        if client is None or not self.courteous(clientid):
            return False
        self._expire(client, "courteous client in the way of another client's request")
        self._assess_pressure(self.now)
        return True

    def reclaim_done(self, clientid: int) -> bool:
        """Has the client sent RECLAIM_COMPLETE (rca_one_fs false)?"""
        client = self.clients.get(clientid)
        return client is not None and client.reclaim_complete

    @property
    def drc_reserved(self) -> int:
        """Octets of the reply-cache budget reserved by all sessions."""
        return self.drc.reserved

    @property
    def cached_bytes(self) -> int:
        return sum(s.slots.cached_bytes for s in self.sessions.values())

    # -- EXCHANGE_ID (18.35) ---------------------------------------------------------------
    def exchange_id(
        self,
        args: nfs4.EXCHANGE_ID4args,
        *,
        principal: Hashable,
        now: float,
        source: str = "",
        gss: bool = False,
    ) -> nfs4.EXCHANGE_ID4resok:
        """``source``: the source address of the connection (``shares.source_of``); ``gss``:
        the call came with RPCSEC_GSS integrity or privacy (SP4_MACH_CRED is possible)."""
        self.now = max(self.now, now)
        flags = args.eia_flags
        if flags & ~EIA_FLAGS_ALLOWED:
            raise SessionError(nfs4.NFS4ERR_INVAL, f"eia_flags {flags:#x}")
        how = args.eia_state_protect.spa_how
        if how == nfs4.SP4_MACH_CRED and not gss:
            raise SessionError(nfs4.NFS4ERR_INVAL, "SP4_MACH_CRED needs RPCSEC_GSS (krb5i/krb5p)")
        if how == nfs4.SP4_SSV:
            raise SessionError(nfs4.NFS4ERR_ENCR_ALG_UNSUPP, "SP4_SSV is not supported")
        owner = args.eia_clientowner
        client, new, dropped = self.clients.exchange_id(
            owner.co_ownerid,
            owner.co_verifier,
            principal,
            bool(flags & nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A),
            now,
            source=source,
            in_use=lambda c: self._in_use(c, now),
            admit=lambda replacing: self._admit_client(owner.co_ownerid, source, now, replacing),
        )
        for old in dropped:
            self._expire(old, "its owner was taken by another principal")
        if new or flags & nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A:
            client.eia_flags = flags & ~nfs4.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A
            client.impl_id = list(args.eia_client_impl_id)
        if client.confirmed:
            client.last_renewed = now
        protect = nfs4.state_protect4_r(nfs4.SP4_NONE)
        if how == nfs4.SP4_MACH_CRED and (new or client.mach_cred == principal):
            asked = args.eia_state_protect.value
            assert isinstance(asked, nfs4.state_protect_ops4)
            enforce = bitmap_ops(asked.spo_must_enforce) & MACH_CRED_OPS
            client.mach_cred = principal
            client.mach_ops = enforce
            # Every operation may come with the machine credential: nothing here ties state
            # to the principal that made it, so spo_must_allow is granted as asked.
            protect = nfs4.state_protect4_r(
                nfs4.SP4_MACH_CRED,
                nfs4.state_protect_ops4(ops_bitmap(enforce), list(asked.spo_must_allow)),
            )
        return nfs4.EXCHANGE_ID4resok(
            eir_clientid=client.clientid,
            eir_sequenceid=(client.cs_seqid + 1) & SEQID_MASK,
            eir_flags=nfs4.EXCHGID4_FLAG_USE_NON_PNFS
            | (nfs4.EXCHGID4_FLAG_CONFIRMED_R if client.confirmed else 0),
            eir_state_protect=protect,
            eir_server_owner=nfs4.server_owner4(0, self.server_owner),
            eir_server_scope=self.server_scope,
            eir_server_impl_id=[self.impl_id],
        )

    def _in_use(self, client: Client, now: float) -> bool:
        if client.lease_expired(now, self.lease_time):
            return False
        return bool(client.sessions) or self.has_state(client.clientid)

    def _admit_client(self, owner: bytes, source: str, now: float, replacing: bool) -> None:
        """May ``owner`` at ``source`` get a new client record now? Rate first (a refused
        request evicts nothing), then the memory caps: the source's share, then the server's
        total, each making room by evicting an old unconfirmed record or a courteous client."""
        if not self._creations.allow(owner, source, now):
            raise SessionError(nfs4.NFS4ERR_DELAY, "client records created too fast")
        if replacing:
            return
        caps = self.caps
        old_enough = now - caps.unconfirmed_grace
        full = self.clients.per_source[source] >= caps.max_clients_per_source
        if full and not self._make_room(old_enough, source):
            raise SessionError(nfs4.NFS4ERR_DELAY, "too many client records from one source")
        if len(self.clients) >= caps.max_clients:
            self._reap_unconfirmed(now)
        if len(self.clients) >= caps.max_clients and not self._make_room(old_enough, None):
            raise SessionError(nfs4.NFS4ERR_DELAY, "too many client records")

    def _make_room(self, old_enough: float, source: str | None) -> bool:
        """Evict one record (of ``source``): the oldest unconfirmed one created before
        ``old_enough``, else the longest-expired courteous client. False if there is none."""
        victim = self.clients.oldest_unconfirmed(old_enough, source)
        if victim is not None:
            self.clients.remove(victim)
            return True
        for client in self._courteous_clients():
            if source is None or client.source == source:
                self._expire(client, "courtesy ended: room needed for a new client")
                return True
        return False

    # -- CREATE_SESSION (18.36) ------------------------------------------------------------
    def create_session(
        self,
        args: nfs4.CREATE_SESSION4args,
        *,
        conn: Hashable,
        principal: Hashable,
        now: float,
        source: str = "",
    ) -> nfs4.CREATE_SESSION4resok:
        """``source``: the source address of ``conn`` (``shares.source_of``)."""
        self.now = max(self.now, now)
        client = self.clients.get(args.csa_clientid)
        if client is None:
            raise SessionError(nfs4.NFS4ERR_STALE_CLIENTID, f"client id {args.csa_clientid:#x}")
        seq = args.csa_sequence
        if seq == client.cs_seqid:
            if client.cs_reply is not None:
                return client.cs_reply  # a retry: the same session (SS-10)
            raise SessionError(nfs4.NFS4ERR_SEQ_MISORDERED, f"csa_sequence {seq} before any")
        if seq != (client.cs_seqid + 1) & SEQID_MASK:
            raise SessionError(
                nfs4.NFS4ERR_SEQ_MISORDERED, f"csa_sequence {seq} after {client.cs_seqid}"
            )
        if args.csa_flags & ~CSA_FLAGS_KNOWN:
            raise SessionError(nfs4.NFS4ERR_INVAL, f"csa_flags {args.csa_flags:#x}")
        back_chan = bool(args.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN)
        fore = negotiate_fore(args.csa_fore_chan_attrs, self.fore_limits)
        back = negotiate_back(args.csa_back_chan_attrs, self.max_request_size, back_chan)
        sec = list(args.csa_sec_parms)
        _check_cb_sec(sec)
        if not client.confirmed and client.principal != principal:
            raise SessionError(nfs4.NFS4ERR_CLID_INUSE, "confirmation by another principal")
        _check_mach(client, nfs4.OP_CREATE_SESSION, principal)
        if len(client.sessions) >= self.caps.max_sessions_per_client:
            raise SessionError(nfs4.NFS4ERR_NOSPC, "too many sessions for this client")
        if len(self.sessions) >= self.caps.max_sessions:
            raise SessionError(nfs4.NFS4ERR_NOSPC, "too many sessions")
        if self._source_sessions[source] >= self.caps.max_sessions_per_source:
            raise SessionError(nfs4.NFS4ERR_NOSPC, "too many sessions from one source")
        # The session that confirms a record was paid for by the EXCHANGE_ID that created it.
        if client.confirmed and not self._creations.allow_owner(client.owner, now):
            raise SessionError(nfs4.NFS4ERR_DELAY, "sessions created too fast")
        asked = fore.ca_maxrequests
        count, per_slot, from_reserve = self._grant_slots(fore, source, client.owner)
        if count < fore.ca_maxrequests:
            log.debug(
                "client %#x at %s: %d of %d slots (%d octets cached)",
                client.clientid,
                source or "?",
                count,
                fore.ca_maxrequests,
                per_slot - SLOT_OVERHEAD,
            )
        fore.ca_maxrequests = count
        fore.ca_maxresponsesize_cached = per_slot - SLOT_OVERHEAD

        sessionid = self._new_sessionid()
        session = Session(
            sessionid=sessionid,
            client=client,
            fore=fore,
            back=back,
            flags=args.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
            cb_program=args.csa_cb_program,
            slots=SlotTable(fore.ca_maxrequests, fore.ca_maxresponsesize_cached),
            backchannel=BackchannelSlots(sessionid, min(back.ca_maxrequests, self.back_slots)),
            created=now,
            drc_reserved=count * per_slot,
            drc_per_slot=per_slot,
            drc_from_reserve=from_reserve,
            source=source,
            high_slots_used=now,
            _cb_sec_parms=sec,
            _wants_back_channel=back_chan,
        )
        if not client.confirmed:
            old = self.clients.confirm(client)
            if old is not None:
                self._expire(old, f"replaced by client {client.clientid:#x}")
            log.info("client %#x confirmed (%d client records)", client.clientid, len(self.clients))
        self.sessions[sessionid] = session
        client.add_session(session)
        self._source_sessions.add(source, 1)
        self._bind(session, conn, BOTH if back_chan else FORE)
        resok = nfs4.CREATE_SESSION4resok(
            csr_sessionid=sessionid,
            csr_sequence=seq,
            csr_flags=session.flags,
            csr_fore_chan_attrs=fore,
            csr_back_chan_attrs=back,
        )
        client.cs_seqid = seq
        client.cs_reply = resok
        client.last_renewed = now
        self._assess_pressure(now, cut_down=count < asked)
        log.info(
            "session %s for client %#x: %d slots, back channel %s",
            sessionid.hex(),
            client.clientid,
            fore.ca_maxrequests,
            "bound" if back_chan else "not requested",
        )
        return resok

    def _grant_slots(
        self, fore: nfs4.channel_attrs4, source: str, owner: bytes
    ) -> tuple[int, int, int]:
        """Reserve the reply cache of a new session: (slots, octets per slot, octets of them
        out of the reserve). What was asked for as far as the general pool and the shares of
        ``source`` and ``owner`` allow, or else a minimal session out of the reserve
        (``shares``); NFS4ERR_NOSPC only when the budget is genuinely spent."""
        caps = self.caps
        floor = min(fore.ca_maxrequests, caps.min_slots)
        per_slot = fore.ca_maxresponsesize_cached + SLOT_OVERHEAD
        count = min(fore.ca_maxrequests, self.drc.room(source, owner) // per_slot)
        if count >= floor:
            self.drc.take(source, owner, count * per_slot)
            return count, per_slot, 0
        per_slot = min(fore.ca_maxresponsesize_cached, caps.min_cached) + SLOT_OVERHEAD
        from_reserve = self.drc.take_minimal(source, owner, floor * per_slot)
        if from_reserve is None:
            raise SessionError(nfs4.NFS4ERR_NOSPC, "reply cache budget exhausted")
        return floor, per_slot, from_reserve

    def _new_sessionid(self) -> bytes:
        while True:
            sessionid = self.random_bytes(16)
            if len(sessionid) == 16 and sessionid not in self.sessions:
                return sessionid

    # -- SEQUENCE (18.46) ------------------------------------------------------------------
    def sequence(
        self,
        args: nfs4.SEQUENCE4args,
        *,
        conn: Hashable,
        now: float,
        op_count: int,
        request_size: int,
    ) -> SequenceResult:
        return self.sequence_of(
            args.sa_sessionid,
            args.sa_sequenceid,
            args.sa_slotid,
            args.sa_highest_slotid,
            args.sa_cachethis,
            conn,
            now,
            op_count,
            request_size,
        )

    def sequence_of(
        self,
        sessionid: bytes,
        seqid: int,
        slotid: int,
        highest: int,
        cachethis: bool,
        conn: Hashable,
        now: float,
        op_count: int,
        request_size: int,
    ) -> SequenceResult:
        """``sequence`` with SEQUENCE4args's fields as they were sent (sa_sessionid,
        sa_sequenceid, sa_slotid, sa_highest_slotid, sa_cachethis): the COMPOUND fast path
        reads them without building the arguments."""
        if now > self.now:
            self.now = now
        session = self.sessions.get(sessionid)
        if session is None:
            raise SessionError(nfs4.NFS4ERR_BADSESSION, sessionid.hex())
        fore = session.fore
        if op_count > fore.ca_maxoperations:
            raise SessionError(nfs4.NFS4ERR_TOO_MANY_OPS, f"{op_count} operations")
        if request_size > fore.ca_maxrequestsize:
            raise SessionError(nfs4.NFS4ERR_REQ_TOO_BIG, f"request of {request_size} bytes")
        bound = session.connections.get(conn, 0)
        if not bound & FORE:
            if not bound and len(session.connections) >= self.caps.max_connections_per_session:
                raise SessionError(nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION, "too many connections")
            if session.client.mach_cred is not None:
                raise SessionError(
                    nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION, "SP4_MACH_CRED: bind it first"
                )
            self._bind(session, conn, bound | FORE)  # SP4_NONE: bound by use (SS-12)
        slots = session.slots
        # The usual case, a new request on an idle slot, without the full classification.
        slot = slots.slots[slotid] if 0 <= slotid < slots.count else None
        if slot is not None and seqid == (slot.seqid + 1) & SEQID_MASK and not slot.busy:
            disposition = Disposition.NEW
        else:
            slot, disposition = slots.classify(slotid, seqid)
        client = session.client
        mark = client.courtesy_mark  # (client.courteous, inlined)
        if mark is not None and mark == client.last_renewed:
            log.info("client %#x is back, its state intact (courtesy)", session.clientid)
            client.courtesy_mark = None
        client.last_renewed = now
        flags = session.seq_status_flags  # (_status_flags' answer, kept until it may change)
        if flags < 0:
            flags = session.seq_status_flags = self._status_flags(session)
        target = slots.target_highest_slotid
        if target < slots.count - 1 and highest <= target:
            slots.client_highest(highest)
        top = slotid if slotid > highest else highest
        if session.slot_cap is not None:
            self._reclaim_recalled(session, top)
        if (  # (what _note_slot_use acts on: slots beyond the minimal ones, or the last)
            top >= slots.count - 1
            or top >= self.caps.min_slots
            or top >= session.fore.ca_maxrequests
        ):
            self._note_slot_use(session, top, now)
        result = SequenceResult(
            session,
            slot,
            seqid,
            slotid,
            slots.count - 1,
            slots.target_highest_slotid,
            flags,
        )
        if disposition is Disposition.NEW:
            slots.begin(slot, seqid)
            result.cachethis = cachethis
        elif disposition is Disposition.REPLAY:
            result.replay = slot.reply
        else:
            result.uncached_retry = True
        return result

    def _note_slot_use(self, session: Session, top: int, now: float) -> None:
        """The client uses slots up to ``top``: remember when it last needed more than the
        minimal ones, and grow a table it fills (after an idle shrink, or one granted short)
        back towards what was negotiated, as far as the budget and shares allow."""
        slots = session.slots
        if top >= min(self.caps.min_slots, session.fore.ca_maxrequests):
            session.high_slots_used = now
        if top < slots.count - 1 or slots.count >= session.fore.ca_maxrequests:
            return
        if self.pressure.on or session.slot_cap is not None:
            return  # no table grows under pressure
        room = self.drc.room(session.source, session.client.owner) // session.drc_per_slot
        more = min(session.fore.ca_maxrequests - slots.count, room)
        if more > 0:
            self._resize(session, slots.count + more)

    def _resize(self, session: Session, count: int) -> None:
        """Give the session ``count`` slots (sr_highest_slotid count - 1) and move its
        reservation with them."""
        change = (count - session.slots.count) * session.drc_per_slot
        session.slots.resize(count)
        session.drc_reserved += change
        self.drc.take(session.source, session.client.owner, change)

    def _reclaim_recalled(self, session: Session, top: int) -> None:
        """The client of a session asked for fewer slots uses none above ``top``: when that is
        below what it may keep, and nothing executes there, take the slots above back."""
        cap = session.slot_cap
        if cap is None or session.slots.count <= cap or top >= cap:
            return
        if any(slot.busy for slot in session.slots.slots[cap:]):
            return
        log.info(
            "session %s gave back %d recalled slots, %d left",
            session.sessionid.hex(),
            session.slots.count - cap,
            cap,
        )
        self._resize(session, cap)

    # -- reply-cache pressure (shares.DrcPressure, shares.shed) ----------------------------
    def _assess_pressure(self, now: float, *, cut_down: bool = False) -> None:
        """The budget changed: recall slots under pressure, let them grow back after it;
        the CB_RECALL_SLOTs decided on go to ``on_slot_recall``."""
        for recall in self.pressure_actions(now, cut_down=cut_down):
            self.slot_recalls += 1
            self.on_slot_recall(recall)

    def pressure_actions(self, now: float, *, cut_down: bool = False) -> list[SlotRecall]:
        """Assess the pool and act on the slot tables (targets lowered, or grown back); return
        the CB_RECALL_SLOTs to send."""
        drc = self.drc
        if not self.pressure.assess(drc.pool_used, drc.pool, cut_down=cut_down):
            self._regrow()
            return []
        pending = 0  # octets that recalled sessions have yet to give back
        holdings: list[SlotHolding[bytes]] = []
        for session in self.sessions.values():
            count = session.slots.count
            may_use = count if session.slot_cap is None else min(count, session.slot_cap)
            pooled = session.drc_reserved - session.drc_from_reserve
            pending += (count - may_use) * session.drc_per_slot
            holdings.append(
                SlotHolding(
                    session.sessionid,
                    may_use,
                    session.drc_per_slot,
                    max(0, pooled - (count - may_use) * session.drc_per_slot),
                    min(self.caps.min_slots, count),
                )
            )
        need = drc.pool_used - pending - self.pressure.low_mark(drc.pool)
        recalls: list[SlotRecall] = []
        for sessionid, keep in shed(holdings, pool=drc.pool, need=need).items():
            session = self.sessions[sessionid]
            log.info(
                "reply cache under pressure (%d of %d octets): session %s asked to use %d of "
                "its %d slots",
                drc.pool_used,
                drc.pool,
                sessionid.hex(),
                keep,
                session.slots.count,
            )
            session.slot_cap = keep
            session.slots.set_target(keep - 1)
            recall = self._recall(session, now)
            if recall is not None:
                recalls.append(recall)
        # A recall not yet obeyed a lease later is sent again (the callback may have been lost).
        for session in self.sessions.values():
            cap = session.slot_cap
            if cap is None or session.slots.count <= cap:
                continue
            if now - session.slot_recall_sent >= self.lease_time:
                recall = self._recall(session, now)
                if recall is not None:
                    recalls.append(recall)
        return recalls

    def _recall(self, session: Session, now: float) -> SlotRecall | None:
        """CB_RECALL_SLOT for a session down to its cap, when its back channel works."""
        assert session.slot_cap is not None
        if not (session.back_path_up and session.backchannel.count):
            return None
        session.slot_recall_sent = now
        return SlotRecall(session.clientid, session.sessionid, session.slot_cap - 1)

    def _regrow(self) -> None:
        """No pressure (any more): recalled sessions grow back towards what they negotiated,
        as far as their shares allow and up to the low-water mark."""
        ceiling = self.pressure.low_mark(self.drc.pool)
        for session in self.sessions.values():
            if session.slot_cap is None:
                continue
            session.slot_cap = None
            slots = session.slots
            slots.set_target(slots.count - 1)
            want = session.fore.ca_maxrequests - slots.count
            if want <= 0:
                continue
            room = min(
                self.drc.room(session.source, session.client.owner),
                ceiling - self.drc.pool_used,
            )
            more = min(want, room // session.drc_per_slot)
            if more > 0:
                log.info("session %s: %d recalled slots given back", session.sessionid.hex(), more)
                self._resize(session, slots.count + more)

    def _reclaim_idle_slots(self, now: float) -> None:
        """Shrink sessions that used no slot above the minimal ones for ``slot_idle_time``."""
        idle_since = now - self.caps.slot_idle_time
        for session in self.sessions.values():
            slots = session.slots
            floor = min(self.caps.min_slots, slots.count)
            if slots.count <= floor or session.high_slots_used > idle_since:
                continue
            if any(slot.busy for slot in slots.slots[floor:]):
                continue
            log.info(
                "session %s idle: %d slots taken back, %d left",
                session.sessionid.hex(),
                slots.count - floor,
                floor,
            )
            self._resize(session, floor)

    def finish(self, seq: SequenceResult, cached: CachedReply | None, now: float) -> None:
        """The COMPOUND that holds ``seq``'s slot is done: keep its reply (when the client
        asked and it fits) and free the slot."""
        if seq.replay is not None or seq.uncached_retry:
            return
        session = seq.session
        if session.destroyed:
            return
        session.slots.complete(seq.slot, seq.seqid, cached if seq.cachethis else None)
        if not session.client.removed:
            session.client.last_renewed = max(session.client.last_renewed, now)

    def _status_flags(self, session: Session) -> int:
        """sr_status_flags computed in full (18.46.3): the client record's flags, and the back
        channel's state. SEQUENCE keeps the answer in ``session.seq_status_flags`` until one
        of the things read here changes (records.py: ``Client.back_changed``)."""
        client = session.client
        flags = client.status_flags
        if session.wants_back_channel:
            if session.back_path_up:
                return flags  # (a session of the client wants a back channel and has one)
            flags |= nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
        wanting = up = False
        for s in client.sessions.values():
            if s.wants_back_channel:
                wanting = True
                if s.back_path_up:
                    up = True
                    break
        if wanting and not up:
            flags |= nfs4.SEQ4_STATUS_CB_PATH_DOWN
        return flags

    # -- connections (BIND_CONN_TO_SESSION 18.34) --------------------------------------------
    def bind_conn_to_session(
        self,
        args: nfs4.BIND_CONN_TO_SESSION4args,
        *,
        conn: Hashable,
        now: float,
        principal: Hashable | None = None,
    ) -> nfs4.BIND_CONN_TO_SESSION4resok:
        session = self.sessions.get(args.bctsa_sessid)
        if session is None:
            raise SessionError(nfs4.NFS4ERR_BADSESSION, args.bctsa_sessid.hex())
        _check_mach(session.client, nfs4.OP_BIND_CONN_TO_SESSION, principal)
        want = _DIRECTIONS.get(args.bctsa_dir)
        if want is None:
            raise SessionError(nfs4.NFS4ERR_INVAL, f"bctsa_dir {args.bctsa_dir}")
        bound = session.connections.get(conn, 0)
        if bound and want != BOTH and bound != want:
            # Already bound, and the client demands a set of channels without one it has.
            raise SessionError(nfs4.NFS4ERR_INVAL, f"connection bound {bound}, asked {want}")
        if not bound and len(session.connections) >= self.caps.max_connections_per_session:
            raise SessionError(nfs4.NFS4ERR_DELAY, "too many connections")
        dirs = bound | want
        if dirs & BACK:
            session.wants_back_channel = True
            session.back_fault = False
        self._bind(session, conn, dirs)
        return nfs4.BIND_CONN_TO_SESSION4resok(
            bctsr_sessid=session.sessionid,
            bctsr_dir=nfs4.channel_dir_from_server4(dirs),
            bctsr_use_conn_in_rdma_mode=False,  # UL-39: an RDMA connection already is
        )

    def bound_to_session(self, conn: Hashable) -> bool:
        """A session's fore or back channel is bound to ``conn``."""
        return bool(self._conn_sessions.get(conn))

    def connection_closed(self, conn: Hashable) -> None:
        for sessionid in self._conn_sessions.pop(conn, ()):
            session = self.sessions.get(sessionid)
            if session is not None:
                session.unbind(conn)

    def _bind(self, session: Session, conn: Hashable, dirs: int) -> None:
        session.bind(conn, dirs)
        self._conn_sessions.setdefault(conn, set()).add(session.sessionid)

    def _unbind_all(self, session: Session) -> None:
        for conn in session.connections:
            ids = self._conn_sessions.get(conn)
            if ids is not None:
                ids.discard(session.sessionid)
                if not ids:
                    del self._conn_sessions[conn]
        session.unbind_all()

    # -- DESTROY_SESSION (18.37), DESTROY_CLIENTID (18.50) -----------------------------------
    def destroy_session(
        self,
        sessionid: bytes,
        *,
        conn: Hashable,
        current: Session | None,
        last_op: bool,
        principal: Hashable | None = None,
    ) -> None:
        session = self.sessions.get(sessionid)
        if session is None:
            raise SessionError(nfs4.NFS4ERR_BADSESSION, sessionid.hex())
        _check_mach(session.client, nfs4.OP_DESTROY_SESSION, principal)
        busy = session.slots.busy
        if current is session:
            if not last_op:
                raise SessionError(nfs4.NFS4ERR_NOT_ONLY_OP, "DESTROY_SESSION of its own session")
            busy -= 1
        elif conn not in session.connections:
            raise SessionError(nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION, sessionid.hex())
        if busy > 0:
            raise SessionError(nfs4.NFS4ERR_DELAY, f"{busy} requests executing")
        if session.backchannel.outstanding:
            if not session.back_path_up:
                raise SessionError(nfs4.NFS4ERR_CB_PATH_DOWN, "callbacks outstanding")
            raise SessionError(nfs4.NFS4ERR_BACK_CHAN_BUSY, "callbacks outstanding")
        self._destroy_session(session)
        log.info("session %s of client %#x destroyed", sessionid.hex(), session.clientid)
        self._assess_pressure(self.now)

    def _destroy_session(self, session: Session) -> None:
        if session.destroyed:
            return
        session.destroyed = True
        self.sessions.pop(session.sessionid, None)
        session.client.drop_session(session)
        self.drc.give_back_reserve(session.drc_from_reserve)
        self.drc.give_back(
            session.source, session.client.owner, session.drc_reserved - session.drc_from_reserve
        )
        session.drc_reserved = session.drc_from_reserve = 0
        self._source_sessions.add(session.source, -1)
        session.slots.clear()
        self._unbind_all(session)

    def destroy_clientid(
        self,
        clientid: int,
        *,
        current: Session | None,
        now: float,
        principal: Hashable | None = None,
    ) -> None:
        client = self.clients.get(clientid)
        if client is None:
            raise SessionError(nfs4.NFS4ERR_STALE_CLIENTID, f"client id {clientid:#x}")
        _check_mach(client, nfs4.OP_DESTROY_CLIENTID, principal)
        if current is not None and current.client is client:
            raise SessionError(nfs4.NFS4ERR_CLIENTID_BUSY, "destroying the COMPOUND's own client")
        if client.sessions:
            raise SessionError(nfs4.NFS4ERR_CLIENTID_BUSY, f"{len(client.sessions)} sessions")
        if client.confirmed and self._in_use(client, now):
            raise SessionError(nfs4.NFS4ERR_CLIENTID_BUSY, "the client holds state")
        if client.confirmed:
            self._expire(client, "DESTROY_CLIENTID")
        else:
            self.clients.remove(client)

    # -- RECLAIM_COMPLETE (18.51), BACKCHANNEL_CTL (18.33) --------------------------------------
    def reclaim_complete(self, clientid: int) -> None:
        client = self.clients.get(clientid)
        if client is None:
            raise SessionError(nfs4.NFS4ERR_STALE_CLIENTID, f"client id {clientid:#x}")
        if client.reclaim_complete:
            raise SessionError(nfs4.NFS4ERR_COMPLETE_ALREADY)
        client.reclaim_complete = True

    def backchannel_ctl(
        self, session: Session, cb_program: int, sec_parms: list[nfs4.callback_sec_parms4]
    ) -> None:
        _check_cb_sec(sec_parms)
        session.cb_program = cb_program
        session.cb_sec_parms = list(sec_parms)
        session.back_fault = False  # new callback parameters: the next callback tries them

    # -- leases (8.3) ----------------------------------------------------------------------
    def reap(self, now: float) -> list[int]:
        """Drop unconfirmed records older than a lease and clients whose lease ran out (with
        nothing executing), with their sessions and reservations, except that clients holding
        state become courteous (see the module docstring) until their courtesy ends; take back
        idle slots. Returns the client ids whose state was dropped."""
        self.now = max(self.now, now)
        expired: list[int] = []
        self._reclaim_idle_slots(now)
        self._creations.expire(now)
        for client in self.clients:
            if not client.confirmed:
                if client.lease_expired(now, self.lease_time):
                    self.clients.remove(client)
            elif client.lease_expired(now, self.lease_time) and not client.busy:
                why = self._courtesy_over(client, now)
                if why is not None:
                    self._expire(client, why)
                    expired.append(client.clientid)
        courteous = self._courteous_clients()
        for client in courteous[: max(0, len(courteous) - self.caps.max_courteous_clients)]:
            self._expire(client, "courtesy ended: too many courteous clients")
            expired.append(client.clientid)
        self._assess_pressure(now)
        return expired

    def _courtesy_over(self, client: Client, now: float) -> str | None:
        """Why a client whose lease ran out must go now, or None: it stays (courteous if it
        holds state; one without state gets ``lease_slack`` more before it goes)."""
        if not self.has_state(client.clientid):
            if client.lease_expired(now, self.lease_time + self.lease_slack):
                return "lease expired"
            return None
        if now - client.last_renewed > self.lease_time + self.caps.courtesy_time:
            return "courtesy time over"
        if not client.courteous:
            client.courtesy_mark = client.last_renewed
            log.info("client %#x: lease expired, state kept until it conflicts", client.clientid)
        return None

    def _courteous_clients(self) -> list[Client]:
        """The courteous clients, longest expired first."""
        found = [c for c in self.clients if self.courteous(c.clientid)]
        found.sort(key=lambda c: c.last_renewed)
        return found

    def _reap_unconfirmed(self, now: float) -> None:
        for client in self.clients:
            if not client.confirmed and client.lease_expired(now, self.lease_time):
                self.clients.remove(client)

    def _expire(self, client: Client, why: str) -> None:
        """Forget a client record with its sessions, and have its state dropped."""
        for session in list(client.sessions.values()):
            self._destroy_session(session)
        self.clients.remove(client)
        if client.confirmed:
            log.info("client %#x dropped: %s", client.clientid, why)
            self.on_client_expired(client.clientid)


def _version() -> str:
    try:
        return importlib.metadata.version("nfsrdma")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


# What SP4_MACH_CRED can protect here (RFC 8881 section 18.35.3 lists these for the client's
# spo_must_enforce): the operations that make, rebind or destroy a client's sessions and record.
MACH_CRED_OPS = frozenset(
    {
        nfs4.nfs_opnum4.OP_CREATE_SESSION,
        nfs4.nfs_opnum4.OP_DESTROY_SESSION,
        nfs4.nfs_opnum4.OP_DESTROY_CLIENTID,
        nfs4.nfs_opnum4.OP_BIND_CONN_TO_SESSION,
    }
)


def bitmap_ops(bitmap: list[int]) -> frozenset[int]:
    return frozenset(
        32 * i + b for i, word in enumerate(bitmap) for b in range(32) if word >> b & 1
    )


def ops_bitmap(ops: frozenset[int]) -> list[int]:
    words = [0] * (max(ops) // 32 + 1) if ops else []
    for op in ops:
        words[op // 32] |= 1 << (op % 32)
    return words


def _check_mach(client: Client, op: int, principal: Hashable | None) -> None:
    """SP4_MACH_CRED: only the machine principal may send ``op`` for ``client``."""
    if principal is None or client.mach_cred is None or op not in client.mach_ops:
        return
    if principal != client.mach_cred:
        raise SessionError(nfs4.NFS4ERR_ACCESS, f"SP4_MACH_CRED: {nfs4.nfs_opnum4(op).name}")


def _check_cb_sec(parms: list[nfs4.callback_sec_parms4]) -> None:
    """The back channel needs a flavour we can send with: AUTH_NONE or AUTH_SYS (no GSS)."""
    if parms and usable_cb_sec(parms) is None:
        raise SessionError(nfs4.NFS4ERR_ENCR_ALG_UNSUPP, "only RPCSEC_GSS offered for callbacks")
