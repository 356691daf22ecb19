"""Delegations at work: granting on OPEN, recalling on conflicts, revoking late returns.

The decisions are in ``delegations.py`` (sans-IO); this module joins them to the rest of the
server: the back channel (CB_NULL probes, CB_RECALL, through ``callback.py``), the kernel
leases that protect delegations against changes made on the server's own file system
(``vfs/leases.py``), the lease-period timer that revokes delegations not returned in time, and
the SEQ4_STATUS_RECALLABLE_STATE_REVOKED flag.

What is granted
---------------
- Only to a client whose back channel works: a session bound for callbacks, with a flavour we
  can send (AUTH_NONE or AUTH_SYS in ``csa_sec_parms`` / BACKCHANNEL_CTL; an empty list or only
  RPCSEC_GSS means no callbacks), and a CB_NULL probe answered. The probe goes out after
  CREATE_SESSION, BIND_CONN_TO_SESSION and BACKCHANNEL_CTL (and from an OPEN that finds the
  callback program, security or connection changed since); until it is answered OPEN gets no
  delegation (WND4_RESOURCE). A failed probe marks the path down (SEQ4_STATUS_CB_PATH_DOWN).
- Not on an OPEN that creates the file, unless the client asks for a delegation (policy in
  ``delegations.py``).
- Only with a kernel lease on the file, as knfsd: without one no delegation is protected
  against changes made on the server's own file system, so none is granted.
- Read delegations: a read lease on a read-only descriptor of the file's own
  (``Vfs.lease_descriptor``). Refused (no CAP_LEASE and not the owner, a local writer, leases
  unavailable): no delegation (WND4_RESOURCE).
- Write delegations: a write lease on the descriptor of the holder's open itself
  (``OpenFile.hold_descriptor``), which Linux grants when that is the file's only open file
  description (knfsd's own opens share one ``struct file`` the same way). The delegation
  borrows the descriptor: a CLOSE of the open while the delegation is held leaves it open
  (and leased) until DELEGRETURN, revocation or the client's expiry let the lease go; READ
  and WRITE with the delegation stateid go through it meanwhile (``Delegation.file``). When
  the kernel refuses (another open of the file, on the server or by the server for another
  open-owner), no write delegation: a read delegation if the client did not ask for a write
  one only (WANT_WRITE_DELEG) and a read lease can be had (it cannot while the holder's open
  writes, so in practice none), else none (WND4_CONTENTION when another open was the
  reason, WND4_RESOURCE otherwise).
- The server's own opens of a file under the client's write delegation (an OPEN by another
  open-owner of the same client, an anonymous READ) and its truncations would break that
  lease and block on it: the delegation is recalled and its lease let go first
  (``check_conflicts``), as for read delegations and local writes.

Local changes the kernel reports: opening the file for writing (read lease) or at all (write
lease), and truncating it. Local unlink/rename break no user-space lease (only knfsd's own),
so they recall nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from nfsrdma.nfs4.attr_decode import decode_values
from nfsrdma.nfs4.attrs import attr_numbers, bitmap_of, encode_attrs, needs_fsstats
from nfsrdma.nfs4.context import CompoundContext
from nfsrdma.nfs4.delegations import (
    ACCESS_WRITE,
    DENY_READ,
    Delegation,
    DelegationTable,
    OtherOpen,
)
from nfsrdma.rpc.ratelog import LineRateLimiter
from nfsrdma.session.records import usable_cb_sec
from nfsrdma.vfs.leases import KernelLeases, Lease
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import XdrError

if TYPE_CHECKING:
    from nfsrdma.nfs4.callback import Callbacks
    from nfsrdma.nfs4.state import OpenState, StateManager
    from nfsrdma.session.server import ServerSessions
    from nfsrdma.vfs.base import Vfs

log = logging.getLogger("nfsrdma.delegations")

_NO_ACE = nfs4.nfsace4(nfs4.ACE4_ACCESS_ALLOWED_ACE_TYPE, 0, 0, b"")
_NO_LIMIT = nfs4.nfs_space_limit4(nfs4.limit_by4.NFS_LIMIT_SIZE, 0xFFFFFFFFFFFFFFFF)


class DelegationService:
    def __init__(
        self,
        state: StateManager,
        sessions: ServerSessions,
        callbacks: Callbacks,
        vfs: Vfs,
        lease_time: float,
        *,
        enabled: bool = True,
    ) -> None:
        self.table: DelegationTable = state.delegations
        # One line per grant would be one per OPEN: a client can provoke them at will.
        self._grant_lines = LineRateLimiter()
        self.sessions = sessions
        self.callbacks = callbacks
        self.vfs = vfs
        self.lease_time = lease_time
        self.enabled = enabled
        self.leases = KernelLeases(self._lease_broken)
        self._probed: dict[bytes, Hashable] = {}  # sessionid -> the back channel probed
        self._probing: dict[Hashable, asyncio.Task[bool]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.table.recall = self._send_recall
        self.table.on_revoked = self._revoked_flag
        self.table.release = self._release_lease

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.enabled:
            self.leases.start(loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in self._probing.values():
            task.cancel()
        self.leases.close()

    # ------------------------------------------------------------------ the back channel

    def _path_key(self, clientid: int) -> tuple[bytes, Hashable] | None:
        path = self.sessions.callback_path(clientid)
        if path is None:
            return None
        session, conn = path
        sec = usable_cb_sec(session.cb_sec_parms)
        if sec is None:
            return None
        return session.sessionid, (session.sessionid, session.cb_program, id(conn), repr(sec))

    def callbacks_ok(self, clientid: int) -> bool:
        """Whether the client's back channel was probed as it is now; starts a probe if not."""
        found = self._path_key(clientid)
        if found is None:
            return False
        sessionid, key = found
        if self._probed.get(sessionid) == key:
            return True
        if key not in self._probing:
            task = asyncio.get_running_loop().create_task(self._probe(clientid, sessionid, key))
            self._probing[key] = task
        return False

    def back_channel_changed(self, clientid: int) -> None:
        """CREATE_SESSION, BIND_CONN_TO_SESSION or BACKCHANNEL_CTL succeeded: probe now."""
        if self.enabled:
            self.callbacks_ok(clientid)

    async def probe(self, clientid: int) -> bool:
        """Probe the client's back channel now (or wait for the probe under way)."""
        found = self._path_key(clientid)
        if found is None:
            return False
        sessionid, key = found
        task = self._probing.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._probe(clientid, sessionid, key))
            self._probing[key] = task
        return await task

    async def _probe(self, clientid: int, sessionid: bytes, key: Hashable) -> bool:
        try:
            ok = await self.callbacks.probe(clientid)
        finally:
            self._probing.pop(key, None)
        if ok:
            self._probed[sessionid] = key
        else:
            self._probed.pop(sessionid, None)
        log.info("client %#x: back channel probe %s", clientid, "answered" if ok else "failed")
        return ok

    # ------------------------------------------------------------------ grant (OPEN)

    def offer(
        self,
        ctx: CompoundContext,
        sm: StateManager,
        state: OpenState,
        want: int,
        *,
        created: bool = False,
    ) -> nfs4.open_delegation4:
        """OPEN's delegation result for the open ``state`` just made or upgraded (``created``:
        the OPEN made the file)."""
        fh = state.file.fh
        clientid = state.clientid
        others = [
            OtherOpen(o.clientid, o.access, o.deny)
            for o in state.file.opens.values()
            if o.clientid != clientid
        ]
        wanted = want not in (
            nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
            nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL,
        )
        decision = self.table.decide(
            clientid,
            fh,
            state.access,
            want,
            others,
            enabled=self.enabled,
            callbacks=self.callbacks_ok(clientid) if self.enabled and wanted else False,
            created=created,
        )
        if decision.write is None:
            return _none(want, decision.why)
        deleg = self.table.held(clientid, fh)
        if deleg is None:
            write = decision.write
            lease = self._write_lease(state) if write else None
            if lease is None:
                refused = self.leases.refused if write else None
                # No write lease: a read delegation instead, unless only a write one is wanted.
                write = False
                only_write = want == nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG
                lease = None if only_write else self._read_lease(fh)
                if lease is None:
                    why = nfs4.WND4_CONTENTION if refused == errno.EAGAIN else nfs4.WND4_RESOURCE
                    return _none(want, why)
            attrs = self.vfs.getattr(fh)
            deleg = self.table.grant(
                clientid, fh, write, ctx.now, change=attrs.change, size=attrs.size
            )
            lease.key = deleg
            deleg.lease = lease
            if write:
                deleg.file = state.openfile
            elif state.openfile.readable and state.openfile.hold_descriptor() is not None:
                # READs with the delegation stateid once the open is closed go through the
                # holder's open file, kept until the delegation goes (else each READ would
                # open the file anew, in the thread pool)
                deleg.file = state.openfile
            suppressed = self._grant_lines.allow(ctx.now)
            if suppressed is not None:
                log.info(
                    "client %#x: %s delegation granted%s",
                    clientid,
                    _kind(deleg),
                    f" ({suppressed} similar lines suppressed)" if suppressed else "",
                )
        if deleg.write:
            return nfs4.open_delegation4(
                nfs4.OPEN_DELEGATE_WRITE,
                nfs4.open_write_delegation4(deleg.stateid, False, _NO_LIMIT, _NO_ACE),
            )
        return nfs4.open_delegation4(
            nfs4.OPEN_DELEGATE_READ, nfs4.open_read_delegation4(deleg.stateid, False, _NO_ACE)
        )

    def _read_lease(self, fh: bytes) -> Lease | None:
        """A read lease on a read-only descriptor of the file's own (the holder's open may
        allow writing, and a read lease needs a read-only descriptor)."""
        if not self.leases.available:
            return None
        try:
            fd = self.vfs.lease_descriptor(fh)
        except OSError:
            return None
        if fd is None:
            return None
        return self.leases.take(fd, False, None)

    def _write_lease(self, state: OpenState) -> Lease | None:
        """A write lease on the descriptor of the holder's open itself (the kernel grants
        one only to the file's sole open file description), kept open for the delegation's
        life even when the open is closed first."""
        self.leases.refused = None
        if not self.leases.available:
            return None
        of = state.openfile
        fd = of.hold_descriptor()
        if fd is None:
            return None
        return self.leases.take(fd, True, None, let_go=of.let_go_descriptor)

    # ------------------------------------------------------------------ recall, revoke

    def _send_recall(self, d: Delegation) -> None:
        log.info("client %#x: recalling its %s delegation", d.clientid, _kind(d))
        self.callbacks.recall(d.clientid, d.stateid, d.fh)
        self._arm()

    def _arm(self) -> None:
        deadline = self.table.next_deadline(self.lease_time)
        if deadline is None:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, deadline - time.monotonic()) + 0.01, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.expire(time.monotonic())
        self._arm()

    def expire(self, now: float) -> list[Delegation]:
        """Revoke the delegations whose recall is older than a lease period at ``now``."""
        late = self.table.expire(now, self.lease_time)
        for d in late:
            log.info("client %#x: %s delegation revoked (not returned)", d.clientid, _kind(d))
        return late

    def _revoked_flag(self, clientid: int, on: bool) -> None:
        self.sessions.set_status_flags(clientid, nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED, on)

    def _lease_broken(self, lease: Lease) -> None:
        d = lease.key
        if isinstance(d, Delegation):
            log.info("client %#x: local change to a delegated file", d.clientid)
            self.table.start_recall(d, time.monotonic())

    def _release_lease(self, d: Delegation) -> None:
        if isinstance(d.lease, Lease):
            self.leases.release(d.lease)
        if not d.write and d.file is not None:
            d.file.let_go_descriptor()  # held at the grant (a write lease lets go its own)
        d.file = None  # its descriptor let go with the lease


def _kind(d: Delegation) -> str:
    return "write" if d.write else "read"


def _none(want: int, why: int) -> nfs4.open_delegation4:
    if want == nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE:
        return nfs4.open_delegation4(nfs4.OPEN_DELEGATE_NONE)
    value = False if why in (nfs4.WND4_CONTENTION, nfs4.WND4_RESOURCE) else None
    return nfs4.open_delegation4(
        nfs4.OPEN_DELEGATE_NONE_EXT, nfs4.open_none_delegation4(nfs4.why_no_delegation4(why), value)
    )


# ---------------------------------------------------------------- conflicts (for the operations)


def table_of(ctx: CompoundContext) -> DelegationTable:
    table: DelegationTable = ctx.server.state_manager.delegations
    return table


def check_conflicts(
    ctx: CompoundContext,
    fh: bytes,
    *,
    write: bool,
    local_write: bool = False,
    local_open: bool = False,
) -> None:
    """Before an operation of this COMPOUND's client changes (``write``) or opens ``fh``:
    NFS4ERR_DELAY, with CB_RECALL sent, while another client's delegation conflicts. When
    the server itself is about to open the file for writing or truncate it (``local_write``),
    or to open it at all (``local_open``), and the client's own delegation holds a kernel
    lease that this would break (a read lease: writing; a write lease: any open), that
    delegation is recalled too and its lease let go first (the server would otherwise block
    on its own lease); the operation goes on."""
    table = table_of(ctx)
    if not table:  # (no delegation at all: nothing to ask)
        return
    clientid = ctx.clientid
    if local_write or local_open:
        mine = table.held(clientid, fh)
        if mine is not None and (
            (local_write and not mine.write) or (mine.write and mine.lease is not None)
        ):
            table.start_recall(mine, ctx.now)
            if mine.lease is not None and table.release is not None:
                table.release(mine)
                mine.lease = None
    _expire_courteous_holders(ctx, table.conflicts(fh, clientid, write=write))
    table.break_conflicts(fh, clientid, write=write, now=ctx.now)


def _expire_courteous_holders(ctx: CompoundContext, conflicting: list[Delegation]) -> None:
    """Courteous expiry (as for opens and locks, ``nfsrdma.nfs4.state``): a delegation whose
    holder's lease has run out is not recalled; its holder is expired, delegation and all, and
    the operation goes ahead at once. Active holders are recalled as usual."""
    sm = ctx.server.state_manager
    leases = sm.leases
    if leases is None or not conflicting:
        return
    courteous = {d.clientid for d in conflicting if leases.courteous(d.clientid)}
    if courteous:
        sm.make_way(courteous)


def check_name(
    ctx: CompoundContext,
    dir_fh: bytes,
    name: bytes,
    *,
    local_write: bool = False,
    local_open: bool = False,
) -> None:
    """REMOVE / RENAME / LINK of ``dir_fh``/``name``: the object it names must not be under
    another client's delegation (NFS4ERR_DELAY while recalled); a missing name is fine."""
    table = table_of(ctx)
    if not table:  # (no delegation at all: nothing to ask)
        return
    session = ctx.session
    others = session is None or table.held_by_others(session.clientid)
    if not (others or local_write or local_open):
        return  # (only another client's delegation could stand in the way: no lookup)
    try:
        fh = ctx.server.vfs.lookup(ctx.cred, dir_fh, name)
    except Exception:  # a missing name, a bad handle...: the operation itself will say so
        return
    check_conflicts(ctx, fh, write=True, local_write=local_write, local_open=local_open)


# ---------------------------------------------------------------- CB_GETATTR (GETATTR)

_CB_ATTRS = (nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE)


def write_delegation_elsewhere(ctx: CompoundContext, fh: bytes, bitmap: list[int]) -> bool:
    """Whether a GETATTR asking for change or size must ask the holder of a write delegation
    of another client first (RFC 8881 section 10.4.3)."""
    table = table_of(ctx)
    if not table or ctx.server.delegation_service is None:
        return False
    if not any(n in attr_numbers(bitmap) for n in _CB_ATTRS):
        return False
    clientid = ctx.session.clientid if ctx.session is not None else None
    return any(
        d.write and d.clientid != clientid for d in table.conflicts(fh, clientid, write=False)
    )


async def getattr_from_holder(
    ctx: CompoundContext, fh: bytes, bitmap: list[int]
) -> nfs4.GETATTR4res:
    """GETATTR of a file under another client's write delegation: CB_GETATTR to the holder;
    its size, and a change attribute moved past ours if it has modified the file."""
    service = ctx.server.delegation_service
    assert service is not None
    clientid = ctx.session.clientid if ctx.session is not None else None
    holders = [d for d in table_of(ctx).conflicts(fh, clientid, write=False) if d.write]
    vfs = ctx.server.vfs
    attrs = vfs.getattr(fh)
    if holders:
        d = holders[0]
        reply = await service.callbacks.getattr(d.clientid, fh, bitmap_of(list(_CB_ATTRS)))
        try:
            values = decode_values(reply) if reply is not None else {}
        except XdrError:  # a holder that cannot encode attributes: ours stand
            values = {}
        size = values.get(nfs4.FATTR4_SIZE)
        change = values.get(nfs4.FATTR4_CHANGE)
        attrs = vfs.getattr(fh)  # after the wait
        if isinstance(size, int) or isinstance(change, int):
            modified = (isinstance(change, int) and change != d.change) or (
                isinstance(size, int) and size != attrs.size
            )
            new_change = attrs.change
            if modified:
                d.served_change = max(d.served_change, attrs.change) + 1
                new_change = d.served_change
            attrs = dataclasses.replace(
                attrs, size=size if isinstance(size, int) else attrs.size, change=new_change
            )
    fsstats = vfs.statfs(fh) if needs_fsstats(bitmap) else None
    fattr = encode_attrs(bitmap, attrs, fsstats, fh, ctx.server.config)
    return nfs4.GETATTR4res(nfs4.NFS4_OK, nfs4.GETATTR4resok(fattr))


def open_conflict_write(access: int, deny: int, truncate: bool) -> bool:
    """Whether an OPEN conflicts with read delegations too (writing, truncating, DENY_READ)."""
    return bool(access & ACCESS_WRITE) or bool(deny & DENY_READ) or truncate
