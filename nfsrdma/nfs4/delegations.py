"""Delegations of the NFSv4.1 server (RFC 8881 sections 10.2, 10.4, 18.16, 18.6, 20.2).

A sans-IO table: which client holds which delegation on which file, whether to grant one on an
OPEN (and why not), which delegations an operation of another client conflicts with, what has
been recalled and when, and which recalls ran out (revocation). Nothing here sends callbacks or
reads a clock: time comes in as ``now``; the callbacks out (CB_RECALL, the revoked-state flag,
releasing the kernel lease) are hooks the server sets.

Policy
------
- One delegation per (client, file). Read delegations are shared between clients; a write
  delegation is exclusive. The holder's own operations never conflict with its delegation.
- A read delegation conflicts with another client's OPEN for write or with DENY_READ, and with
  another client's REMOVE / RENAME / LINK / SETATTR(size, mode) of the file; a write delegation
  conflicts with every OPEN of another client, and with the same name-space changes.
- A conflicting operation gets NFS4ERR_DELAY; the holder gets CB_RECALL once. If it has not
  sent DELEGRETURN within a lease period of the recall, the delegation is revoked: the file is
  free again, the holder's use of the stateid gets NFS4ERR_DELEG_REVOKED, and its SEQUENCE replies
  carry SEQ4_STATUS_RECALLABLE_STATE_REVOKED until it has FREE_STATEID'd every revoked stateid.
- An OPEN that creates the file gets no delegation unless the client asks for one
  (OPEN4_SHARE_ACCESS_WANT_*_DELEG): a file just made is mostly written, closed and read or
  removed by others next, so a delegation there costs a lease, a DELEGRETURN and often a recall
  for nothing (knfsd delegates no create either). Opens of existing files are delegated.
- Delegation stateids never change seqid (always 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4

if TYPE_CHECKING:
    from nfsrdma.vfs.base import OpenFile

ACCESS_READ: Final = nfs4.OPEN4_SHARE_ACCESS_READ
ACCESS_WRITE: Final = nfs4.OPEN4_SHARE_ACCESS_WRITE
DENY_READ: Final = nfs4.OPEN4_SHARE_DENY_READ
DEFAULT_LIMIT: Final = 100_000  # delegations server-wide before WND4_RESOURCE

WANT_NO_PREFERENCE: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_NO_PREFERENCE
WANT_READ: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG
WANT_WRITE: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG
WANT_ANY: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG
WANT_NONE: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG
WANT_CANCEL: Final = nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL


@dataclass(eq=False, slots=True)
class Delegation:
    other: bytes
    clientid: int
    fh: bytes
    write: bool
    granted: float
    recalled: float | None = None  # when CB_RECALL was first asked for
    revoked: bool = False
    lease: object | None = None  # the kernel lease protecting it (the VFS's handle)
    # the holder's open file (a write delegation's lease is on its descriptor; a read
    # delegation holds it too): it serves I/O with the delegation stateid after the open is
    # closed, until the delegation goes
    file: OpenFile | None = None
    change: int = 0  # the change attribute when granted (CB_GETATTR's baseline)
    size: int = 0
    served_change: int = 0  # the change attribute last answered for the holder's writes

    @property
    def stateid(self) -> nfs4.stateid4:
        return nfs4.stateid4(1, self.other)

    @property
    def kind(self) -> int:
        return nfs4.OPEN_DELEGATE_WRITE if self.write else nfs4.OPEN_DELEGATE_READ


@dataclass(frozen=True, slots=True)
class Decision:
    """What OPEN answers: ``write`` None means no delegation, for the reason ``why``."""

    write: bool | None
    why: int = nfs4.why_no_delegation4.WND4_NOT_WANTED


@dataclass(frozen=True, slots=True)
class OtherOpen:
    """Another client's open of the file (what a grant must not contend with)."""

    clientid: int
    access: int
    deny: int


class DelegationTable:
    def __init__(self, new_other: Callable[[], bytes], limit: int = DEFAULT_LIMIT) -> None:
        self._new_other = new_other
        self.limit = limit
        self._by_other: dict[bytes, Delegation] = {}
        self._by_file: dict[bytes, dict[int, Delegation]] = {}
        self._revoked: dict[int, dict[bytes, Delegation]] = {}  # revoked, not yet freed
        self._filed = 0  # the delegations in _by_file (every OPEN asks: no sum over files)
        self._filed_of: dict[int, int] = {}  # the same, by client
        # Hooks set by the server: send CB_RECALL; (client, any revoked state left?);
        # release the kernel lease of a delegation that goes.
        self.recall: Callable[[Delegation], None] | None = None
        self.on_revoked: Callable[[int, bool], None] | None = None
        self.release: Callable[[Delegation], None] | None = None
        self.granted = 0
        self.recalls = 0
        self.revocations = 0

    # ------------------------------------------------------------------ lookups

    def __len__(self) -> int:
        return self._filed  # (= sum(len(d) for d in self._by_file.values()))

    def __bool__(self) -> bool:  # (what len() > 0 says, without counting: no file is left empty)
        return bool(self._by_file)

    def held_by_others(self, clientid: int) -> bool:
        """Whether a client other than ``clientid`` holds a delegation on some file."""
        return self._filed > self._filed_of.get(clientid, 0)

    def get(self, other: bytes) -> Delegation | None:
        return self._by_other.get(other)

    def held(self, clientid: int, fh: bytes) -> Delegation | None:
        return self._by_file.get(fh, {}).get(clientid)

    def on_file(self, fh: bytes) -> list[Delegation]:
        return list(self._by_file.get(fh, {}).values())

    def client_has(self, clientid: int) -> bool:
        return any(d.clientid == clientid for d in self._by_other.values())

    def find(self, clientid: int, sid: nfs4.stateid4, fh: bytes | None = None) -> Delegation:
        """The delegation ``sid`` names for ``clientid``: NFS4ERR_DELEG_REVOKED once revoked,
        NFS4ERR_BAD_STATEID when it is not one of this client's (or of ``fh``), and
        NFS4ERR_OLD_STATEID / BAD_STATEID for a seqid other than 0 or 1."""
        d = self._by_other.get(sid.other)
        if d is None or d.clientid != clientid:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        if d.revoked:
            raise Nfs4Error(nfs4.NFS4ERR_DELEG_REVOKED)
        if fh is not None and d.fh != fh:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        if sid.seqid not in (0, 1):
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        return d

    def test(self, clientid: int, sid: nfs4.stateid4) -> int | None:
        """TEST_STATEID's answer for a delegation stateid; None when it is not one."""
        d = self._by_other.get(sid.other)
        if d is None:
            return None
        if d.clientid != clientid or sid.seqid not in (0, 1):
            return nfs4.NFS4ERR_BAD_STATEID
        return nfs4.NFS4ERR_DELEG_REVOKED if d.revoked else nfs4.NFS4_OK

    # ------------------------------------------------------------------ grant

    def decide(
        self,
        clientid: int,
        fh: bytes,
        access: int,
        want: int,
        others: list[OtherOpen],
        *,
        enabled: bool,
        callbacks: bool,
        created: bool = False,
    ) -> Decision:
        """Whether an OPEN of ``fh`` by ``clientid`` (with ``access``, the union of its open,
        and ``want``, the OPEN4_SHARE_ACCESS_WANT_* value; ``created``: this OPEN made the file)
        gets a delegation, and which."""
        if want in (WANT_NONE, WANT_CANCEL):
            why = nfs4.WND4_NOT_WANTED if want == WANT_NONE else nfs4.WND4_CANCELLED
            return Decision(None, why)
        if created and want == WANT_NO_PREFERENCE:
            return Decision(None, nfs4.WND4_NOT_WANTED)
        if not enabled or not callbacks or len(self) >= self.limit:
            return Decision(None, nfs4.WND4_RESOURCE)
        mine = self.held(clientid, fh)
        theirs = [d for d in self.on_file(fh) if d.clientid != clientid]
        if mine is not None and mine.recalled is not None:
            return Decision(None, nfs4.WND4_CONTENTION)
        wants_write = bool(access & ACCESS_WRITE) or want == WANT_WRITE
        if wants_write and want in (WANT_NO_PREFERENCE, WANT_WRITE, WANT_ANY):
            if others or theirs:
                return Decision(None, nfs4.WND4_CONTENTION)
            if mine is not None and not mine.write:
                return Decision(None, nfs4.WND4_NOT_SUPP_UPGRADE)
            return Decision(True)
        if access & ACCESS_WRITE:  # WANT_READ with write access: a read delegation won't do
            return Decision(None, nfs4.WND4_CONTENTION)
        if any(o.access & ACCESS_WRITE for o in others) or any(d.write for d in theirs):
            return Decision(None, nfs4.WND4_CONTENTION)
        if any(d.recalled is not None for d in theirs):
            return Decision(None, nfs4.WND4_CONTENTION)
        return Decision(mine.write if mine is not None else False)

    def grant(
        self, clientid: int, fh: bytes, write: bool, now: float, *, change: int = 0, size: int = 0
    ) -> Delegation:
        """The delegation given to ``clientid`` on ``fh`` (its existing one, if it has one)."""
        existing = self.held(clientid, fh)
        if existing is not None:
            return existing
        d = Delegation(self._new_other(), clientid, fh, write, now, change=change, size=size)
        self._by_other[d.other] = d
        self._by_file.setdefault(fh, {})[clientid] = d
        self._filed += 1
        self._filed_of[clientid] = self._filed_of.get(clientid, 0) + 1
        self.granted += 1
        return d

    # ------------------------------------------------------------------ conflicts, recall

    def conflicts(self, fh: bytes, clientid: int | None, *, write: bool) -> list[Delegation]:
        """The delegations on ``fh`` that an operation of ``clientid`` (None: the server's own
        file system) conflicts with: every write delegation of another client, and read
        delegations too when the operation writes (or removes / renames the file)."""
        return [
            d
            for d in self.on_file(fh)
            if d.clientid != clientid and (write or d.write) and not d.revoked
        ]

    def break_conflicts(self, fh: bytes, clientid: int | None, *, write: bool, now: float) -> None:
        """NFS4ERR_DELAY while another client's delegation stands in the way, with CB_RECALL
        sent (once) to each holder; nothing when there is no conflict."""
        found = self.conflicts(fh, clientid, write=write)
        if not found:
            return
        for d in found:
            self.start_recall(d, now)
        raise Nfs4Error(nfs4.NFS4ERR_DELAY)

    def start_recall(self, d: Delegation, now: float) -> None:
        if d.recalled is not None or d.revoked:
            return
        d.recalled = now
        self.recalls += 1
        if self.recall is not None:
            self.recall(d)

    # ------------------------------------------------------------------ return, revoke, free

    def delegreturn(self, clientid: int, sid: nfs4.stateid4, fh: bytes) -> None:
        """DELEGRETURN (section 18.6): a revoked one is NFS4ERR_DELEG_REVOKED (FREE_STATEID it)."""
        d = self.find(clientid, sid, fh)
        self._drop(d)

    def free(self, clientid: int, sid: nfs4.stateid4) -> bool:
        """FREE_STATEID of a delegation stateid: a revoked one goes (True); a live one is
        NFS4ERR_LOCKS_HELD (return it with DELEGRETURN); False when ``sid`` is not one."""
        d = self._by_other.get(sid.other)
        if d is None:
            return False
        if d.clientid != clientid:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        if not d.revoked:
            raise Nfs4Error(nfs4.NFS4ERR_LOCKS_HELD)
        del self._by_other[d.other]
        revoked = self._revoked.get(clientid, {})
        revoked.pop(d.other, None)
        if not revoked:
            self._revoked.pop(clientid, None)
            if self.on_revoked is not None:
                self.on_revoked(clientid, False)
        return True

    def revoke(self, d: Delegation) -> None:
        """Take the delegation away: the file is free; the stateid stays, revoked, until freed."""
        if d.revoked:
            return
        self._unfile(d)
        d.revoked = True
        self.revocations += 1
        first = d.clientid not in self._revoked
        self._revoked.setdefault(d.clientid, {})[d.other] = d
        if first and self.on_revoked is not None:
            self.on_revoked(d.clientid, True)

    def expire(self, now: float, lease_time: float) -> list[Delegation]:
        """Revoke every delegation recalled more than ``lease_time`` ago; return them."""
        late = [
            d
            for d in self._by_other.values()
            if d.recalled is not None and not d.revoked and now - d.recalled > lease_time
        ]
        for d in late:
            self.revoke(d)
        return late

    def next_deadline(self, lease_time: float) -> float | None:
        """When the earliest outstanding recall runs out (for the server's timer)."""
        times = [
            d.recalled + lease_time
            for d in self._by_other.values()
            if d.recalled is not None and not d.revoked
        ]
        return min(times) if times else None

    def purge(self, clientid: int) -> None:
        """Everything of a client goes (its record expired or was destroyed)."""
        for d in [d for d in self._by_other.values() if d.clientid == clientid]:
            if not d.revoked:
                self._unfile(d)
            self._by_other.pop(d.other, None)
        self._revoked.pop(clientid, None)

    def close(self) -> None:
        for clientid in {d.clientid for d in self._by_other.values()}:
            self.purge(clientid)

    def _drop(self, d: Delegation) -> None:
        self._unfile(d)
        self._by_other.pop(d.other, None)

    def _unfile(self, d: Delegation) -> None:
        held = self._by_file.get(d.fh)
        if held is not None and held.get(d.clientid) is d:
            del held[d.clientid]
            self._filed -= 1
            left = self._filed_of[d.clientid] - 1
            if left:
                self._filed_of[d.clientid] = left
            else:
                del self._filed_of[d.clientid]
            if not held:
                del self._by_file[d.fh]
        if d.lease is not None:
            if self.release is not None:
                self.release(d)
            d.lease = None
        d.file = None
