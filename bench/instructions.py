"""Instructions per operation, counted by valgrind (callgrind), for A/B comparisons that the
machine's load cannot disturb.

Process CPU time on a shared two-core machine spreads by more than the changes being measured;
an instruction count does not move with load (the same binary, inputs and environment give the
same count). This runs a benchmark command under ``valgrind --tool=callgrind`` twice per
variant, with two operation counts, and prints the difference per operation, so that start-up
(imports, the export's set-up, mypyc's module initialisation) cancels out. Instructions are not
time (a cache miss or a system call costs more than its count says) but they resolve a change of
a few percent in the Python or compiled code around the kernel's.

A variant is ``NAME=TREE[:ENV=VALUE,...]``: the benchmark runs from ``TREE`` (its own copy of
the command's script, ``PYTHONPATH=TREE``) with those environment variables, e.g. the pure and
compiled builds of one checkout::

    python bench/instructions.py --variant pure=.:NFSRDMA_PURE=1 --variant compiled=. \\
        -- bench/server_cpu.py --shapes read --repeat 1 --rss-count 0 --count {n}

``{n}`` in the command is replaced by each of ``--counts`` (default ``200,1200``). One line per
variant: ``<name>_instr=<per operation>``; last line, every variant's figure and, with two
variants, ``b_over_a=`` (the second's count over the first's).

``--cycles`` adds callgrind's cache and branch simulation (slower) and prints, per operation,
the first-level instruction-cache misses (``<name>_i1miss=``) and the estimate of cycles that
KCachegrind uses, ``Ir + 10 * (L1 misses + mispredicted branches) + 100 * last-level misses``
(``<name>_cycles=``); ``b_over_a=`` is then the cycles' ratio. The simulated caches are
valgrind's model of the host's, not the host's own, but a build whose code no longer fits the
instruction cache shows there, and the estimate is as load-independent as the count.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_EVENTS = re.compile(r"^events:\s*(.+)$", re.MULTILINE)
_TOTALS = re.compile(r"^(?:summary|totals):\s*([\d ]+)$", re.MULTILINE)
SIMULATE = ("--cache-sim=yes", "--branch-sim=yes")


def count(
    tree: Path, env: dict[str, str], command: list[str], n: int, *, simulate: bool = False
) -> dict[str, int]:
    """callgrind's totals (``Ir``, and with ``simulate`` the cache and branch events) of one run
    of ``command`` with ``{n}`` set to ``n``, in ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *(SIMULATE if simulate else ()),
            str(
                python if (python := tree / ".venv" / "bin" / "python").exists() else sys.executable
            ),
            *(a.replace("{n}", str(n)) for a in command),
        ]
        run_env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0", **env)
        done = subprocess.run(argv, cwd=tree, env=run_env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
            raise SystemExit(f"{tree}: the command failed under valgrind ({done.returncode})")
        text = out.read_text()
        events, totals = _EVENTS.search(text), _TOTALS.search(text)
        if events is None or totals is None:
            raise SystemExit(f"{out}: no events or summary line")
        return dict(zip(events.group(1).split(), map(int, totals.group(1).split()), strict=True))


def per_op(
    runs: list[dict[str, int]], counts: tuple[int, int], f: Callable[[dict[str, int]], float]
) -> float:
    """``f`` of the run with more operations, less ``f`` of the other, per operation."""
    return (f(runs[1]) - f(runs[0])) / (counts[1] - counts[0])


def cycles(ev: dict[str, int]) -> float:
    """KCachegrind's cycle estimate from callgrind's simulated events."""
    l1 = ev["I1mr"] + ev["D1mr"] + ev["D1mw"]
    last = ev["ILmr"] + ev["DLmr"] + ev["DLmw"]
    return ev["Ir"] + 10 * (l1 + ev["Bcm"] + ev["Bim"]) + 100 * last


def variant(spec: str) -> tuple[str, Path, dict[str, str]]:
    name, _, rest = spec.partition("=")
    tree, _, envs = rest.partition(":")
    env = dict(e.split("=", 1) for e in envs.split(",") if e)
    return name, Path(tree or ".").resolve(), env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=TREE[:ENV=V,...]")
    ap.add_argument("--counts", default="200,1200", help="the two operation counts")
    ap.add_argument(
        "--cycles", action="store_true", help="simulate caches and branches; estimate cycles"
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- script and its arguments")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{n}" in a for a in command):
        ap.error("the command must contain {n}, the operation count")
    low, high = (int(c) for c in args.counts.split(","))
    lines: list[str] = []
    ratio_of: list[float] = []
    for spec in args.variant:
        name, tree, env = variant(spec)
        runs = [count(tree, env, command, c, simulate=args.cycles) for c in (low, high)]
        instr = per_op(runs, (low, high), lambda ev: ev["Ir"])
        text, figure = f"{name}_instr={instr:.0f}", instr
        if args.cycles:
            figure = per_op(runs, (low, high), cycles)
            i1miss = per_op(runs, (low, high), lambda ev: ev["I1mr"])
            text += f" {name}_i1miss={i1miss:.0f} {name}_cycles={figure:.0f}"
        ratio_of.append(figure)
        print(text, flush=True)
        lines.append(text)
    line = " ".join(lines)
    if len(ratio_of) == 2:
        line += f" b_over_a={ratio_of[1] / ratio_of[0]:.3f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
