"""What the client does about a COMPOUND's outcome: sans-IO decisions (RFC 8881 sections
2.10.6, 2.10.13, 8.4, 15.1; RFC 8267 section 6.7.2).

The driver (``session/client.py``) asks these functions what to do and does it; nothing here
touches a connection or a clock of its own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nfsrdma.xdr.gen import nfs4


class Action(enum.Enum):
    DONE = "done"  # hand the result to the caller (success or an error the caller maps)
    RETRY_SAME_SEQID = "retry-same-seqid"  # same slot, same seqid, after a delay
    RETRY = "retry"  # a new request (the server processed this one), after a delay
    RETRY_UNCACHED = "retry-uncached"  # the reply is too big for the slot's cache: no cachethis
    RESET_SLOT = "reset-slot"  # SEQ_MISORDERED: ask the slot table what next
    PICK_OTHER_SLOT = "pick-other-slot"  # BADSLOT / BAD_HIGH_SLOT: the table shrank
    NEW_SESSION = "new-session"  # the session is gone; the client id may still be good
    NEW_CLIENT = "new-client"  # the client id is gone: EXCHANGE_ID, CREATE_SESSION, reclaim
    FAIL = "fail"


# SEQUENCE's own failures: the server did not process the request on the slot.
_SEQUENCE_ACTIONS: dict[int, Action] = {
    nfs4.NFS4ERR_DELAY: Action.RETRY_SAME_SEQID,  # the original is still running on the slot
    nfs4.NFS4ERR_SEQ_MISORDERED: Action.RESET_SLOT,
    nfs4.NFS4ERR_BADSLOT: Action.PICK_OTHER_SLOT,
    nfs4.NFS4ERR_BAD_HIGH_SLOT: Action.PICK_OTHER_SLOT,
    nfs4.NFS4ERR_BADSESSION: Action.NEW_SESSION,
    nfs4.NFS4ERR_DEADSESSION: Action.NEW_SESSION,
    nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION: Action.NEW_SESSION,
    nfs4.NFS4ERR_STALE_CLIENTID: Action.NEW_CLIENT,
    nfs4.NFS4ERR_EXPIRED: Action.NEW_CLIENT,
}

# Failures of a later operation after a successful SEQUENCE (the seqid is used up).
_RETRY_STATUSES = frozenset({nfs4.NFS4ERR_DELAY, nfs4.NFS4ERR_GRACE})
_CLIENT_GONE = frozenset({nfs4.NFS4ERR_STALE_CLIENTID, nfs4.NFS4ERR_EXPIRED})


def after_sequence_error(status: int) -> Action:
    """SEQUENCE itself failed with ``status``."""
    return _SEQUENCE_ACTIONS.get(status, Action.FAIL)


def after_compound(status: int, *, idempotent: bool, reclaim: bool = False) -> Action:
    """SEQUENCE succeeded; ``status`` is the COMPOUND's (the first failing operation's)."""
    if status == nfs4.NFS4_OK:
        return Action.DONE
    if status in _RETRY_STATUSES:
        # NFS4ERR_GRACE: the server is in its grace period; only reclaims go through.
        if status == nfs4.NFS4ERR_GRACE and reclaim:
            return Action.DONE
        return Action.RETRY
    if status == nfs4.NFS4ERR_RETRY_UNCACHED_REP:
        # The original ran but its reply was not kept: an idempotent request is simply run
        # again; for anything else the outcome cannot be known (the caller sees the error).
        return Action.RETRY if idempotent else Action.DONE
    if status == nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE:
        return Action.RETRY_UNCACHED
    if status in _CLIENT_GONE:
        return Action.NEW_CLIENT
    if status in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_DEADSESSION):
        return Action.NEW_SESSION
    return Action.DONE


class FlagAction(enum.Flag):
    NONE = 0
    REBIND_BACKCHANNEL = enum.auto()  # CB_PATH_DOWN(_SESSION): bind a connection for callbacks
    RECLAIM = enum.auto()  # RESTART_RECLAIM_NEEDED: the server lost our state; reclaim it
    STATE_LOST = enum.auto()  # some or all state revoked or expired: re-establish opens


def after_status_flags(flags: int, *, want_backchannel: bool) -> FlagAction:
    """sr_status_flags of a successful SEQUENCE."""
    out = FlagAction.NONE
    if want_backchannel and flags & (
        nfs4.SEQ4_STATUS_CB_PATH_DOWN | nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
    ):
        out |= FlagAction.REBIND_BACKCHANNEL
    if flags & nfs4.SEQ4_STATUS_RESTART_RECLAIM_NEEDED:
        out |= FlagAction.RECLAIM
    if flags & (
        nfs4.SEQ4_STATUS_EXPIRED_ALL_STATE_REVOKED
        | nfs4.SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED
        | nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED
        | nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
    ):
        out |= FlagAction.STATE_LOST
    return out


@dataclass(slots=True)
class Backoff:
    """Bounded exponential back-off for NFS4ERR_DELAY and friends: each delay doubles from
    ``initial`` up to ``cap``; after ``deadline`` seconds in all, ``next_delay`` says stop."""

    initial: float = 0.01
    cap: float = 1.0
    deadline: float = 60.0
    started: float | None = None
    attempts: int = 0

    def next_delay(self, now: float) -> float | None:
        """How long to wait before the next attempt; None when the deadline has passed."""
        if self.started is None:
            self.started = now
        elapsed = now - self.started
        if elapsed >= self.deadline:
            return None
        delay = min(self.cap, self.initial * 2.0 ** min(self.attempts, 60))
        self.attempts += 1
        return min(delay, max(0.0, self.deadline - elapsed))
