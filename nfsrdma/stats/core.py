"""Per-operation counters and latency histograms, sans-IO.

Cheap on the hot path: recording an operation is a dictionary look-up, a few integer adds and one
``bisect`` into fixed log-scale bucket bounds (five per decade, 1 us to 100 s); the caller reads
the clock (once per operation, each latency being the time since the previous operation of the
same COMPOUND ended). Percentiles are estimated from the buckets, interpolated geometrically
inside the bucket that holds them, so they are within one bucket's width (a factor of 1.6) of
the exact value.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any

from nfsrdma.xdr.gen import nfs4

# Upper bounds (seconds) of the latency buckets; one more bucket past the last holds the rest.
BOUNDS: tuple[float, ...] = tuple(10 ** (k / 5 - 6) for k in range(41))


class OpFigures:
    """One operation's figures: calls, errors by status, latency buckets and their sum."""

    __slots__ = ("buckets", "errors", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.errors: dict[int, int] = {}
        self.buckets = [0] * (len(BOUNDS) + 1)

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile latency in seconds (0 when nothing was recorded)."""
        return percentile(self.buckets, q)


def percentile(buckets: list[int], q: float) -> float:
    """The ``q``-th percentile (0-100) of values counted in ``buckets`` (as ``OpFigures``)."""
    total = sum(buckets)
    if total == 0:
        return 0.0
    rank = max(1.0, q / 100 * total)
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            if i >= len(BOUNDS):
                return BOUNDS[-1]  # beyond the last bound: all we know is its lower edge
            hi = BOUNDS[i]
            lo = BOUNDS[i - 1] if i else hi / 10 ** (1 / 5)
            frac = (rank - seen - 0.5) / n if n > 1 else 0.5  # a lone value: the middle
            frac = min(1.0, max(0.0, frac))
            return lo * math.exp(frac * math.log(hi / lo))
        seen += n
    return BOUNDS[-1]


class OpTable:
    """The operations of one transport (or of one client): figures by operation number."""

    __slots__ = ("compounds", "ops", "replays")

    def __init__(self) -> None:
        self.ops: dict[int, OpFigures] = {}
        self.compounds = 0  # COMPOUNDs begun
        self.replays = 0  # ... answered from the reply cache

    def record(
        self, opnum: int, status: int, seconds: float, _at: Any = bisect_left, _b: Any = BOUNDS
    ) -> None:
        """One operation done with ``status`` after ``seconds`` (the hot path: kept short)."""
        try:
            fig = self.ops[opnum]
        except KeyError:
            fig = self.ops[opnum] = OpFigures()
        fig.seconds += seconds
        fig.buckets[_at(_b, seconds)] += 1
        if status:
            fig.errors[status] = fig.errors.get(status, 0) + 1

    def record_run(
        self, start: float, done: list[tuple[int, int, float]], replayed: bool = False
    ) -> None:
        """One COMPOUND begun at ``start`` (monotonic seconds): its operations, each as
        (operation number, status, when it ended), the first one's latency measured from
        ``start`` and each next one's from the end of the one before (the server's view; what
        ``record`` would count for each); ``replayed`` when the reply cache answered it."""
        self.compounds += 1
        if replayed:
            self.replays += 1
        figures, bounds = self.ops, BOUNDS
        before = start
        for opnum, status, end in done:
            fig = figures.get(opnum)
            if fig is None:
                fig = figures[opnum] = OpFigures()
            seconds = end - before
            before = end
            fig.seconds += seconds
            fig.buckets[bisect_left(bounds, seconds)] += 1
            if status:
                errors = fig.errors
                errors[status] = errors.get(status, 0) + 1

    def record_compound(self, results: list[tuple[int, int]], seconds: float) -> None:
        """A COMPOUND's results, (operation number, status) each, all in ``seconds``: the
        requester's view, where every operation of a COMPOUND shares its round trip."""
        self.compounds += 1
        for opnum, status in results:
            self.record(opnum, status, seconds)

    def snapshot(self, *, buckets: bool = False) -> dict[str, Any]:
        """Plain data (JSON-able): operations by name, each with count, errors by status name,
        p50/p99 and mean in milliseconds (and the bucket counts when asked)."""
        ops: dict[str, Any] = {}
        for opnum, fig in sorted(self.ops.items()):
            count = fig.count
            one: dict[str, Any] = {
                "count": count,
                "errors": {status_name(s): n for s, n in sorted(fig.errors.items())},
                "p50_ms": round(fig.percentile(50) * 1000, 4),
                "p99_ms": round(fig.percentile(99) * 1000, 4),
                "mean_ms": round(fig.seconds / count * 1000, 4) if count else 0.0,
                "seconds": fig.seconds,
            }
            if buckets:
                one["buckets"] = list(fig.buckets)
            ops[op_name(opnum)] = one
        return {"compounds": self.compounds, "replays": self.replays, "ops": ops}


class ServerStats:
    """What the COMPOUND loop feeds: one ``OpTable`` per transport kind ("tcp", "rdma")."""

    def __init__(self) -> None:
        self.tables: dict[str, OpTable] = {}

    def table(self, transport: str) -> OpTable:
        t = self.tables.get(transport)
        if t is None:
            t = self.tables[transport] = OpTable()
        return t


def op_name(opnum: int) -> str:
    """``READ`` for OP_READ (the name nfsstat shows), or the number."""
    try:
        return nfs4.nfs_opnum4(opnum).name.removeprefix("OP_")
    except ValueError:
        return str(opnum)


def status_name(status: int) -> str:
    try:
        return nfs4.nfsstat4(status).name
    except ValueError:
        return str(status)
