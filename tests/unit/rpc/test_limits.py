"""The sans-IO parts of connection hardening (issue 9, hole 3): admission with a share per
source, the idle/record-timeout verdicts, and the rate limit on log lines."""

from __future__ import annotations

import pytest

from nfsrdma.rpc.admission import ConnectionAdmission, source_of
from nfsrdma.rpc.idle import IdleTimeouts, IdleTracker
from nfsrdma.rpc.ratelog import LineRateLimiter


@pytest.mark.parametrize(
    ("peer", "source"),
    [
        ("127.0.0.1:2049", "127.0.0.1"),
        ("::1:40000", "::1"),
        ("[fe80::1]:20049", "fe80::1"),
        ("fe80::1", "fe80::1"),
        ("192.0.2.7", "192.0.2.7"),
        ("rdma-peer", "rdma-peer"),
        ("?", "?"),
    ],
)
def test_source_of(peer: str, source: str) -> None:
    assert source_of(peer) == source


def test_admission_total_and_share_per_source() -> None:
    adm = ConnectionAdmission(max_total=5, max_per_source=3)
    assert [adm.admit("a") for _ in range(3)] == [None, None, None]
    assert "share per source is 3" in (adm.admit("a") or "")
    assert adm.admit("b") is None and adm.admit("b") is None
    assert "limit is 5" in (adm.admit("c") or "")  # all five taken
    assert adm.refused == 2
    adm.release("a")
    assert adm.admit("c") is None  # a place freed by one source serves another
    assert adm.total == 5 and adm.by_source == {"a": 2, "b": 2, "c": 1}
    for s in ("a", "a", "b", "b", "c", "c"):  # a release too many is ignored
        adm.release(s)
    assert adm.total == 0 and adm.by_source == {}


def _check(t: IdleTracker, now: float, **kw: object) -> str | None:
    state: dict[str, object] = {
        "messages": 0,
        "receiving": False,
        "busy": False,
        "has_session": False,
    }
    state.update(kw)
    return t.check(now, **state).close  # type: ignore[arg-type]


T = IdleTimeouts(idle=300, record=30)


def test_nothing_sent_is_closed_after_the_record_timeout() -> None:
    t = IdleTracker(T, now=1000)
    assert t.first_check() == 1030
    assert (
        t.check(1010, messages=0, receiving=False, busy=False, has_session=False).check_at == 1030
    )
    assert _check(t, 1029.9) is None
    assert _check(t, 1030) == "no complete record within 30 s"


def test_a_first_record_dribbled_is_closed_after_the_record_timeout() -> None:
    t = IdleTracker(T, now=0)
    assert _check(t, 20, receiving=True) is None
    assert _check(t, 30, receiving=True) == "no complete record within 30 s"


def test_idle_connection_is_closed_after_the_idle_timeout() -> None:
    t = IdleTracker(T, now=0)
    assert _check(t, 10, messages=1) is None  # seen active at 10
    v = t.check(40, messages=1, receiving=False, busy=False, has_session=False)
    assert v.close is None and v.check_at == 70  # looks again every record timeout
    assert _check(t, 309.9, messages=1) is None
    assert _check(t, 310, messages=1) == "idle for 300 s"


def test_new_messages_keep_it_open() -> None:
    t = IdleTracker(T, now=0)
    for i in range(1, 40):
        assert _check(t, 30.0 * i, messages=i) is None
    assert _check(t, 30.0 * 39 + 300, messages=39) == "idle for 300 s"


def test_slow_loris_after_a_valid_record() -> None:
    """A record begun and left incomplete is closed one record timeout after a check saw it,
    long before the idle timeout."""
    t = IdleTracker(T, now=0)
    assert _check(t, 30, messages=1) is None
    assert _check(t, 60, messages=1, receiving=True) is None  # first seen half-way at 60
    assert _check(t, 89, messages=1, receiving=True) is None
    assert _check(t, 90, messages=1, receiving=True) == "record incomplete for 30 s"


def test_a_record_that_completes_resets_the_record_clock() -> None:
    t = IdleTracker(T, now=0)
    assert _check(t, 30, messages=1, receiving=True) is None
    # Records completed meanwhile (another is under way): a new record, a new deadline.
    assert _check(t, 60, messages=5, receiving=True) is None
    assert _check(t, 89, messages=5, receiving=True) is None
    assert _check(t, 90, messages=5, receiving=True) == "record incomplete for 30 s"


def test_session_or_outstanding_call_is_never_closed() -> None:
    t = IdleTracker(T, now=0)
    for now in (30, 1000, 10_000):
        assert _check(t, now, has_session=True) is None
        assert _check(t, now, has_session=True, receiving=True) is None
    t = IdleTracker(T, now=0)
    assert _check(t, 5000, messages=1, busy=True) is None
    # Once the call is answered the idle clock starts from the check that saw it busy.
    assert _check(t, 5299, messages=1) is None
    assert _check(t, 5300, messages=1) == "idle for 300 s"


def test_timeouts_can_be_turned_off() -> None:
    assert not IdleTimeouts(0, 0).enabled
    t = IdleTracker(IdleTimeouts(idle=0, record=30), now=0)
    assert _check(t, 10, messages=1) is None
    assert _check(t, 1e9, messages=1) is None
    t = IdleTracker(IdleTimeouts(idle=100, record=0), now=0)
    assert _check(t, 99, receiving=True) is None
    assert _check(t, 100, receiving=True) == "idle for 100 s"


def test_log_lines_are_rate_limited_with_a_count_of_those_suppressed() -> None:
    lim = LineRateLimiter(burst=3, period=1.0)
    # Ordinary operation: a line now and then, each let through, nothing suppressed.
    assert [lim.allow(t) for t in (0.0, 5.0, 10.0)] == [0, 0, 0]
    # A flood: 1000 lines in one second, three get through.
    got = [lim.allow(20 + i / 1000) for i in range(1000)]
    assert got[:3] == [0, 0, 0] and got[3:] == [None] * 997
    assert lim.flush(20.5) == 0  # the window is not over: the next line will carry the count
    assert lim.allow(21.0) == 997
    # The end of a flood is reported by flush once its window is over.
    for i in range(10):
        lim.allow(30 + i / 100)
    assert lim.flush(31.0) == 7
    assert lim.flush(40.0) == 0
