"""Recovery decisions (RFC 8881 2.10.6, 15.1; UL-25, SS-13) and bounded back-off."""

from __future__ import annotations

import pytest

from nfsrdma.session.client_recovery import (
    Action,
    Backoff,
    FlagAction,
    after_compound,
    after_sequence_error,
    after_status_flags,
)
from nfsrdma.xdr.gen import nfs4


@pytest.mark.parametrize(
    ("status", "action"),
    [
        (nfs4.NFS4ERR_DELAY, Action.RETRY_SAME_SEQID),
        (nfs4.NFS4ERR_SEQ_MISORDERED, Action.RESET_SLOT),
        (nfs4.NFS4ERR_BADSLOT, Action.PICK_OTHER_SLOT),
        (nfs4.NFS4ERR_BADSESSION, Action.NEW_SESSION),
        (nfs4.NFS4ERR_DEADSESSION, Action.NEW_SESSION),
        (nfs4.NFS4ERR_STALE_CLIENTID, Action.NEW_CLIENT),
        (nfs4.NFS4ERR_EXPIRED, Action.NEW_CLIENT),
        (nfs4.NFS4ERR_SERVERFAULT, Action.FAIL),
    ],
)
def test_sequence_errors(status: int, action: Action) -> None:
    assert after_sequence_error(status) is action


def test_compound_outcomes() -> None:
    assert after_compound(nfs4.NFS4_OK, idempotent=False) is Action.DONE
    assert after_compound(nfs4.NFS4ERR_NOENT, idempotent=True) is Action.DONE
    assert after_compound(nfs4.NFS4ERR_DELAY, idempotent=False) is Action.RETRY
    assert after_compound(nfs4.NFS4ERR_GRACE, idempotent=True) is Action.RETRY
    assert after_compound(nfs4.NFS4ERR_GRACE, idempotent=True, reclaim=True) is Action.DONE
    # A retry whose reply was not cached: run an idempotent request again, report otherwise.
    assert after_compound(nfs4.NFS4ERR_RETRY_UNCACHED_REP, idempotent=True) is Action.RETRY
    assert after_compound(nfs4.NFS4ERR_RETRY_UNCACHED_REP, idempotent=False) is Action.DONE
    assert after_compound(nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE, idempotent=False) is (
        Action.RETRY_UNCACHED
    )
    assert after_compound(nfs4.NFS4ERR_EXPIRED, idempotent=True) is Action.NEW_CLIENT
    assert after_compound(nfs4.NFS4ERR_BADSESSION, idempotent=True) is Action.NEW_SESSION


def test_status_flags() -> None:
    f = after_status_flags(nfs4.SEQ4_STATUS_CB_PATH_DOWN, want_backchannel=True)
    assert f == FlagAction.REBIND_BACKCHANNEL
    assert (
        after_status_flags(nfs4.SEQ4_STATUS_CB_PATH_DOWN, want_backchannel=False) == FlagAction.NONE
    )
    f = after_status_flags(
        nfs4.SEQ4_STATUS_RESTART_RECLAIM_NEEDED | nfs4.SEQ4_STATUS_ADMIN_STATE_REVOKED,
        want_backchannel=False,
    )
    assert FlagAction.RECLAIM in f and FlagAction.STATE_LOST in f


def test_backoff_doubles_to_a_cap_and_stops_at_the_deadline() -> None:
    b = Backoff(initial=0.1, cap=0.5, deadline=2.0)
    now = 100.0
    delays = []
    while (d := b.next_delay(now)) is not None:
        delays.append(d)
        now += d
    assert delays[:4] == [0.1, 0.2, 0.4, 0.5]
    assert max(delays) == 0.5
    assert sum(delays) == pytest.approx(2.0)
