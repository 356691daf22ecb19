"""Stable client records, the grace period and reclaim (RFC 8881 sections 8.4.2, 8.4.3, 18.51).

Sans-IO: the decisions live here, the clock is passed in (``now``, monotonic seconds) and the
records go to disk through a :class:`RecordStore` (``nfsrdma.vfs.clientdb`` in the server).

Records
-------
A client is recorded on stable storage by its ``co_ownerid`` when it may hold state a restart
would make it want back: on its RECLAIM_COMPLETE (``rca_one_fs`` false) and, should that ever
come first, on its first successful non-reclaim OPEN. Its record goes when its client ID is
expired or destroyed. After a restart the records of the previous instance say who may
reclaim (as knfsd's nfsdcld does).

Grace
-----
A restart with records starts a grace period of ``grace_time`` seconds (one lease by default),
counted from when the server accepts connections (``serving``).
During it only reclaims take state (OPEN with CLAIM_PREVIOUS, LOCK with ``reclaim`` set);
any other OPEN or LOCK, and I/O or a SETATTR of size with a special stateid (whose right to
proceed depends on share reservations that may still be reclaimed: section 8.4.2 and knfsd),
get NFS4ERR_GRACE. Grace ends when the time is up or, earlier, once every client that had a
record has sent RECLAIM_COMPLETE; records of clients that did not come back are then
forgotten. A first start (no records) has no grace period. When the time is up while a client
that came back is still reclaiming (a reclaim of it was accepted, its RECLAIM_COMPLETE has not
come), the period is extended once, to twice ``grace_time`` from its start, so that a client
slowed down by a loaded server does not lose what it was reclaiming (knfsd extends its grace
period for clients still reclaiming up to the same bound).

Reclaims get NFS4ERR_NO_GRACE outside the grace period, from a client that has no record of
the previous instance, and from a client that already sent RECLAIM_COMPLETE (section 18.51.3).

Section 18.51.3: "If non-reclaim locking operations are done before the RECLAIM_COMPLETE, an
NFS4ERR_GRACE error will be returned" -- a client ID that has not sent RECLAIM_COMPLETE gets
NFS4ERR_GRACE for a non-reclaim OPEN or LOCK at any time, in grace or not (knfsd does the same
for OPEN). The Linux client sends RECLAIM_COMPLETE right after CREATE_SESSION.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4

if TYPE_CHECKING:
    from nfsrdma.nfs4.context import CompoundContext
    from nfsrdma.vfs.base import SharedGrace

log = logging.getLogger("nfsrdma.grace")


class RecordStore(Protocol):
    """Where the client records live (stable storage): the set of recorded co_ownerids."""

    def load(self) -> set[bytes]: ...

    def save(self, owners: set[bytes]) -> None:
        """Replace the records by ``owners``, durably, before returning."""


class MemoryStore:
    """Records that do not survive the process (tests, and servers without a state dir)."""

    def __init__(self, owners: Iterable[bytes] = ()) -> None:
        self.owners = set(owners)
        self.saves = 0

    def load(self) -> set[bytes]:
        return set(self.owners)

    def save(self, owners: set[bytes]) -> None:
        self.owners = set(owners)
        self.saves += 1


class Grace:
    """The grace period of one server instance and the client records behind it."""

    def __init__(
        self,
        store: RecordStore,
        grace_time: float,
        now: float,
        shared: SharedGrace | None = None,
    ) -> None:
        self.store = store
        self.shared = shared  # other servers of a shared file system (vfs/ceph/grace.py)
        self.previous: frozenset[bytes] = frozenset(store.load())
        self._recorded: set[bytes] = set(self.previous)
        self._reclaimed: set[bytes] = set()  # previous owners that sent RECLAIM_COMPLETE
        self._owners: dict[int, bytes] = {}  # client id -> co_ownerid, of recorded clients
        self.reclaimed_opens = 0
        self.reclaimed_locks = 0
        self.grace_time = grace_time
        self._started = now  # the period's start (``serving`` moves it)
        self._reclaiming: set[bytes] = set()  # previous owners with an accepted reclaim
        self._extended = False
        self._active = bool(self.previous)
        self.ended_why = "" if self._active else "no clients to reclaim"
        self.ends_at = now + grace_time if self._active else now
        if self._active:
            log.info("grace period of %gs: %d clients may reclaim", grace_time, len(self.previous))
            if shared is not None:
                shared.begin(grace_time)

    # ------------------------------------------------------------------ the period

    def serving(self, now: float) -> None:
        """The server accepts connections from ``now``: the period runs from here, so that a
        slow start (opening the state, the RDMA device) does not eat the time the previous
        clients have to come back and reclaim."""
        if self._active and now + self.grace_time > self.ends_at:
            self._started = now
            self.ends_at = now + self.grace_time

    def in_grace(self, now: float) -> bool:
        """In our grace period, or in another server's (a shared file system)."""
        return self.own_grace(now) or (self.shared is not None and self.shared.in_grace())

    def own_grace(self, now: float) -> bool:
        """In this instance's own grace period (the one its previous clients reclaim in)."""
        if self._active and now >= self.ends_at:
            if not self._extended and self._reclaiming - self._reclaimed:
                self._extended = True
                self.ends_at = self._started + 2 * self.grace_time
                log.info(
                    "grace period extended by %gs: %d clients are still reclaiming",
                    self.grace_time,
                    len(self._reclaiming - self._reclaimed),
                )
            if now >= self.ends_at:
                self._end("time is up")
        return self._active

    def tick(self, now: float) -> None:
        """Let the period end on time even when no request asks (the server's timer)."""
        self.own_grace(now)

    def _end(self, why: str) -> None:
        self._active = False
        self.ended_why = why
        gone = self.previous - self._reclaimed - set(self._owners.values())
        log.info(
            "grace period over (%s): %d opens and %d locks reclaimed; %d clients did not come back",
            why,
            self.reclaimed_opens,
            self.reclaimed_locks,
            len(gone),
        )
        if gone & self._recorded:
            self._recorded -= gone
            self.store.save(self._recorded)
        if self.shared is not None:
            self.shared.end()

    # ------------------------------------------------------------------ checks

    def check_reclaim(self, owner: bytes, reclaim_complete: bool, now: float) -> None:
        """A reclaim (CLAIM_PREVIOUS OPEN, LOCK with reclaim set) by ``owner``'s client:
        NFS4ERR_NO_GRACE unless it is in grace, known from before and not yet complete."""
        if not self.own_grace(now):
            raise Nfs4Error(nfs4.NFS4ERR_NO_GRACE)
        if owner not in self.previous or reclaim_complete:
            raise Nfs4Error(nfs4.NFS4ERR_NO_GRACE)
        self._reclaiming.add(owner)

    def check_new_state(self, reclaim_complete: bool, now: float) -> None:
        """A non-reclaim OPEN or LOCK: NFS4ERR_GRACE before the client's RECLAIM_COMPLETE
        (section 18.51.3) and during the grace period."""
        if not reclaim_complete or self.in_grace(now):
            raise Nfs4Error(nfs4.NFS4ERR_GRACE)

    def check_special_io(self, now: float) -> None:
        """I/O (or SETATTR of size) with a special stateid, which only share reservations
        govern: NFS4ERR_GRACE while those may still be reclaimed."""
        if self.in_grace(now):
            raise Nfs4Error(nfs4.NFS4ERR_GRACE)

    # ------------------------------------------------------------------ events

    def reclaim_complete(self, clientid: int, owner: bytes, now: float) -> None:
        """The client sent RECLAIM_COMPLETE: record it; the last previous client to do so
        ends the grace period."""
        self._record(clientid, owner)
        if owner in self.previous:
            self._reclaimed.add(owner)
            if self.own_grace(now) and self._reclaimed >= self.previous:
                self._end("every client reclaimed")

    def took_state(self, clientid: int, owner: bytes) -> None:
        """A non-reclaim OPEN succeeded: the client must be on record (it normally is)."""
        if self._owners.get(clientid) != owner:
            self._record(clientid, owner)

    def client_gone(self, clientid: int) -> None:
        """The client ID was expired or destroyed: forget its record (unless another client
        ID of the same owner is still recorded)."""
        owner = self._owners.pop(clientid, None)
        if owner is None or owner in self._owners.values():
            return
        if self._active and owner in self.previous and owner not in self._reclaimed:
            return  # its reclaim right from the previous instance stands until grace ends
        if owner in self._recorded:
            self._recorded.discard(owner)
            self.store.save(self._recorded)

    def _record(self, clientid: int, owner: bytes) -> None:
        self._owners[clientid] = owner
        if owner not in self._recorded:
            self._recorded.add(owner)
            self.store.save(self._recorded)

    @property
    def recorded(self) -> frozenset[bytes]:
        return frozenset(self._recorded)


# ---------------------------------------------------------------------- operation glue


def check_locking(ctx: CompoundContext, reclaim: bool) -> None:
    """Before an OPEN or LOCK takes state: the reclaim or non-reclaim rules above."""
    session = ctx.session
    if session is None:
        raise Nfs4Error(nfs4.NFS4ERR_OP_NOT_IN_SESSION)
    client, grace = session.client, ctx.server.grace
    if reclaim:
        grace.check_reclaim(client.owner, client.reclaim_complete, ctx.now)
    else:
        grace.check_new_state(client.reclaim_complete, ctx.now)


def opened(ctx: CompoundContext, reclaim: bool) -> None:
    """An OPEN succeeded."""
    session, grace = ctx.session, ctx.server.grace
    if reclaim:
        grace.reclaimed_opens += 1
    elif session is not None:
        grace.took_state(session.clientid, session.client.owner)


def locked(ctx: CompoundContext, reclaim: bool) -> None:
    """A LOCK succeeded."""
    if reclaim:
        ctx.server.grace.reclaimed_locks += 1


def reclaim_completed(ctx: CompoundContext) -> None:
    """RECLAIM_COMPLETE (rca_one_fs false) succeeded."""
    session = ctx.session
    if session is not None:
        ctx.server.grace.reclaim_complete(session.clientid, session.client.owner, ctx.now)


def check_special_stateid(ctx: CompoundContext) -> None:
    """READ/WRITE/SETATTR of size with a special stateid that share reservations govern."""
    ctx.server.grace.check_special_io(ctx.now)
