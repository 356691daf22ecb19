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
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_TOTALS = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


def count(tree: Path, env: dict[str, str], command: list[str], n: int) -> int:
    """Instructions of one run of ``command`` with ``{n}`` set to ``n``, in ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
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
        got = _TOTALS.search(out.read_text())
        if got is None:
            raise SystemExit(f"{out}: no summary line")
        return int(got.group(1))


def variant(spec: str) -> tuple[str, Path, dict[str, str]]:
    name, _, rest = spec.partition("=")
    tree, _, envs = rest.partition(":")
    env = dict(e.split("=", 1) for e in envs.split(",") if e)
    return name, Path(tree or ".").resolve(), env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=TREE[:ENV=V,...]")
    ap.add_argument("--counts", default="200,1200", help="the two operation counts")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- script and its arguments")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or not any("{n}" in a for a in command):
        ap.error("the command must contain {n}, the operation count")
    low, high = (int(c) for c in args.counts.split(","))
    figures: list[tuple[str, float]] = []
    for spec in args.variant:
        name, tree, env = variant(spec)
        per_op = (count(tree, env, command, high) - count(tree, env, command, low)) / (high - low)
        print(f"{name}_instr={per_op:.0f}", flush=True)
        figures.append((name, per_op))
    line = " ".join(f"{name}_instr={v:.0f}" for name, v in figures)
    if len(figures) == 2:
        line += f" b_over_a={figures[1][1] / figures[0][1]:.3f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
