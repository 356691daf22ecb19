"""The statistics core: latency buckets and percentiles, counters by status, snapshots."""

from __future__ import annotations

import itertools
import random

import pytest

from nfsrdma.stats.core import BOUNDS, OpTable, percentile
from nfsrdma.xdr.gen import nfs4


def test_bounds_are_log_scale_from_a_microsecond_to_100_seconds() -> None:
    assert BOUNDS[0] == pytest.approx(1e-6)
    assert BOUNDS[-1] == pytest.approx(100.0)
    ratios = {round(b / a, 6) for a, b in itertools.pairwise(BOUNDS)}
    assert ratios == {round(10 ** (1 / 5), 6)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_within_one_bucket_of_the_exact_value(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-9, 1.5) for _ in range(5000)]  # ~ 100 us, wide spread
    t = OpTable()
    for v in values:
        t.record(nfs4.OP_READ, 0, v)
    fig = t.ops[nfs4.OP_READ]
    data = sorted(values)
    step = 10 ** (1 / 5)
    for q in (50, 90, 99):
        exact = data[int(q / 100 * len(data)) - 1]
        assert exact / step <= fig.percentile(q) <= exact * step, q
    assert fig.seconds == pytest.approx(sum(values))
    assert fig.count == 5000


def test_percentile_edges() -> None:
    empty = [0] * (len(BOUNDS) + 1)
    assert percentile(empty, 50) == 0.0
    t = OpTable()
    t.record(nfs4.OP_GETATTR, 0, 0.0)  # below the first bound
    t.record(nfs4.OP_GETATTR, 0, 1e6)  # past the last: counted in the overflow bucket
    fig = t.ops[nfs4.OP_GETATTR]
    assert fig.buckets[0] == 1 and fig.buckets[-1] == 1
    assert 0 < fig.percentile(50) <= BOUNDS[0]
    assert fig.percentile(100) == BOUNDS[-1]


def test_counters_by_operation_and_status() -> None:
    t = OpTable()
    t.record(nfs4.OP_LOOKUP, nfs4.NFS4_OK, 1e-4)
    t.record(nfs4.OP_LOOKUP, nfs4.NFS4ERR_NOENT, 1e-4)
    t.record(nfs4.OP_LOOKUP, nfs4.NFS4ERR_NOENT, 2e-4)
    t.record(nfs4.OP_LOOKUP, nfs4.NFS4ERR_ACCESS, 1e-4)
    t.record_compound([(nfs4.OP_PUTFH, 0), (nfs4.OP_READ, nfs4.NFS4ERR_STALE)], 3e-3)
    snap = t.snapshot()
    assert snap["compounds"] == 1
    lookup = snap["ops"]["LOOKUP"]
    assert lookup["count"] == 4
    assert lookup["errors"] == {"NFS4ERR_NOENT": 2, "NFS4ERR_ACCESS": 1}
    assert 0.06 < lookup["p50_ms"] < 0.16
    assert snap["ops"]["PUTFH"]["errors"] == {}
    assert snap["ops"]["READ"] == {
        **snap["ops"]["READ"],
        "count": 1,
        "errors": {"NFS4ERR_STALE": 1},
        "mean_ms": 3.0,
    }
    assert "buckets" not in lookup
    assert sum(t.snapshot(buckets=True)["ops"]["LOOKUP"]["buckets"]) == 4
