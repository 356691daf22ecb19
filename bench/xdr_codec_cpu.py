"""``bench/xdr_codec.py``'s messages timed by process CPU, source trees alternated.

``xdr_codec.py`` takes wall time, the best of 7 rounds: on a shared machine its spread is wider
than a change of a few percent. This runs the same six functions (ours and xdrlib3's, for each
of its three messages) from each tree's own ``bench/xdr_codec.py``, in a fresh process per tree
and run, each timed as the minimum over ``--rounds`` rounds of ``--calls`` calls of
``time.process_time``; the trees are alternated ``--runs`` times (A, B, A, B, ...).

One line per run and tree (µs per call of each function, and the run's ratio), then the medians
and ranges per tree. Last line: ``ratio=<first tree, median> [b_ratio=<second> b_over_a=…]``
(xdrlib3 time / our time over the three messages, as ``xdr_codec.py`` computes it).

    python bench/xdr_codec_cpu.py --tree . --tree /path/to/start-point --runs 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FUNCTIONS = (
    "ours_call",
    "x_call",
    "ours_read_reply",
    "x_read_reply",
    "ours_getattr_reply",
    "x_getattr_reply",
)


def measure(tree: Path, rounds: int, calls: int) -> dict[str, float]:
    """µs per call of each function of ``tree``'s ``bench/xdr_codec.py`` (run in this process)."""
    sys.path[:0] = [str(tree / "bench"), str(tree)]
    import xdr_codec

    out: dict[str, float] = {}
    for name in FUNCTIONS:
        fn = getattr(xdr_codec, name)
        fn()
        best = float("inf")
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            best = min(best, (time.process_time() - t0) / calls)
        out[name] = best * 1e6
    return out


def ratio(us: dict[str, float]) -> float:
    ours = us["ours_call"] + us["ours_read_reply"] + us["ours_getattr_reply"]
    return (us["x_call"] + us["x_read_reply"] + us["x_getattr_reply"]) / ours


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", type=Path, help="a checkout (repeat for A/B)")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child.resolve(), args.rounds, args.calls)))
        return 0
    trees = [t.resolve() for t in args.tree or [HERE]]
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for run in range(args.runs):
        for tree in trees:
            cmd = [sys.executable, __file__, "--child", str(tree)]
            cmd += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
            us = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            results[tree].append(us)
            times = " ".join(f"{k}={v:.2f}" for k, v in us.items())
            print(f"run {run} {tree}: {times} ratio={ratio(us):.3f}", flush=True)
    medians: list[float] = []
    for tree in trees:
        runs = results[tree]
        parts = []
        for name in FUNCTIONS:
            values = [us[name] for us in runs]
            parts.append(
                f"{name}={statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
            )
        ratios = [ratio(us) for us in runs]
        medians.append(statistics.median(ratios))
        print(
            f"{tree}: {' '.join(parts)} ratio={medians[-1]:.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )
    last = f"ratio={medians[0]:.2f}"
    if len(medians) > 1:
        last += f" b_ratio={medians[1]:.2f} b_over_a={medians[1] / medians[0]:.3f}"
    print(last)
    return 0


if __name__ == "__main__":
    sys.exit(main())
