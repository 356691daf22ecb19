"""A benchmark's figures under qemu's TCG emulation, on the host, without booting the test bed.

The test bed's guest runs under qemu's TCG, where our server's CPU per COMPOUND is what the
test-bed ratios measure, and where the compiled build has measured slower than the pure one
(docs/performance.md, "The compiled build under emulation"). In-guest figures of one build
swing by up to 2x between runs; qemu's user-mode emulator (``qemu-x86_64``, Debian's
``qemu-user``) runs one process under the same translator, on the host, in seconds, and its
figures repeat within a few per cent. This runs a benchmark script's last line under it for
each variant, alternated ``--runs`` times, and prints the medians.

A variant is ``NAME=TREE[:ENV=VALUE,...]`` as in ``bench/instructions.py``, e.g. the two
builds of one checkout::

    python bench/tcg_cpu.py --variant pure=.:NFSRDMA_PURE=1 --variant compiled=. \\
        -- bench/server_compound.py --count 300 --repeat 5

Two gaps of qemu 7.2's user mode are bridged inside the emulated process only (``--inner``):
statx's mount id comes back as 0 (the resolver would then take every object for one on another
mount), so the mount id is read with ``name_to_handle_at``, which qemu passes through; and
``pwritev2`` with flags fails with EOPNOTSUPP, so a write with ``RWF_SYNC`` is a plain write and
an ``fsync``. ``open_tree`` (ENOSYS) and fanotify (ENOSYS) need nothing: the server runs without
them as it does on a kernel that lacks them (a warning, and no move watch).

``--perf`` runs each emulated process under ``perf record`` (a software clock, which needs no
hardware counters) and adds where the emulator's time went to the figures, in samples of 1 ms:
``translated_samples`` (the guest code as qemu translated it), ``tb_hash_samples``
(``qht_lookup_custom``: the search of qemu's table of translated blocks when the small cache an
indirect branch looks in first has no entry for its target), ``emulator_samples`` (the rest of
qemu: that cache's lookup helper, translation, system calls) and ``total_samples``. The whole
process is sampled, its start included.

One line per variant with its medians (``<name> key=… key=…``); the last line every numeric key
of the benchmark's last line (or, when it has none, of its ``NAME FIGURE`` lines) per variant, ``<key>_<name>=…``, and with two variants
``<key>_b_over_a=…`` (the second's median over the first's).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from instructions import variant  # NAME=TREE[:ENV=V,...], as there


def _bridge_qemu_user() -> None:
    """Work around qemu-user's statx mount id and pwritev2 flags (see the docstring)."""
    from nfsrdma.vfs import syscalls

    def mount_id(fd: int) -> int | None:
        try:
            return syscalls.fd_handle(fd)[2]
        except OSError:
            return None

    pwritev = os.pwritev

    def pwritev_flags(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        n = pwritev(fd, buffers, offset)
        if flags & (os.RWF_SYNC | os.RWF_DSYNC):
            os.fsync(fd)
        return n

    syscalls.mount_id = mount_id  # type: ignore[assignment]
    os.pwritev = pwritev_flags  # type: ignore[assignment]


def inner(script: str, argv: list[str]) -> None:
    """The emulated process: bridge qemu-user's gaps, then run the script as ``__main__``."""
    _bridge_qemu_user()
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


# "  5.39%   1234  qemu-x86_64  [.] qht_lookup_custom"; translated code's DSO is "[JIT] tid N"
_PERF_LINE = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(.+?)\s+\[[.k]\]\s+(\S+)")


def perf_split(data: Path) -> dict[str, float]:
    """``perf report``'s samples of one emulated run, by where they fell (see ``--perf``)."""
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--sort", "dso,sym", "-n", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    split = dict.fromkeys(("translated", "tb_hash", "emulator", "total"), 0.0)
    for line in report.splitlines():
        m = _PERF_LINE.match(line)
        if m is None:
            continue
        samples, dso, sym = int(m[1]), m[2], m[3]
        split["total"] += samples
        if dso.startswith("[JIT]"):
            split["translated"] += samples
        elif sym == "qht_lookup_custom":
            split["tb_hash"] += samples
        elif dso.startswith("qemu"):
            split["emulator"] += samples
    return {f"{k}_samples": v for k, v in split.items()}


def last_line(
    tree: Path, env: dict[str, str], qemu: str, command: list[str], perf: Path | None = None
) -> dict[str, float]:
    """The numeric ``key=value`` pairs of the last line the command prints under qemu (with
    ``perf``, a file for ``perf record``'s samples, their split too)."""
    python = tree / ".venv" / "bin" / "python"
    argv = [qemu, str(python if python.exists() else sys.executable)]
    if perf is not None:
        argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1000", "-o", str(perf), *argv]
    argv += [str(tree / "bench" / "tcg_cpu.py"), "--inner", *command]
    run_env = dict(os.environ, PYTHONPATH=str(tree), **env)
    done = subprocess.run(argv, cwd=tree, env=run_env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"{tree}: the command failed under {qemu} ({done.returncode})")
    figures = {}
    for word in lines[-1].split():
        key, _, value = word.partition("=")
        with contextlib.suppress(ValueError):
            figures[key] = float(value)
    if not figures:  # a benchmark that prints one "NAME FIGURE" line per figure
        for line in lines:
            words = line.split()
            if len(words) == 2:
                with contextlib.suppress(ValueError):
                    figures[words[0]] = float(words[1])
    if perf is not None:
        figures.update(perf_split(perf))
    return figures


def main() -> int:
    if sys.argv[1:2] == ["--inner"]:
        inner(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=TREE[:ENV=V,...]")
    ap.add_argument("--runs", type=int, default=3, help="runs of each variant, alternated")
    ap.add_argument("--qemu", default="qemu-x86_64", help="the user-mode emulator")
    ap.add_argument("--perf", action="store_true", help="where the emulator's time went")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no benchmark command (after --)")
    qemu = shutil.which(args.qemu)
    if qemu is None:
        ap.error(f"{args.qemu} not found (apt-get install qemu-user)")
    if args.perf and shutil.which("perf") is None:
        ap.error("perf not found (apt-get install linux-perf)")
    variants = [variant(v) for v in args.variant]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="tcg-cpu-") as tmp:
        perf = Path(tmp) / "perf.data" if args.perf else None
        for _ in range(args.runs):
            for name, tree, env in variants:
                runs[name].append(last_line(tree, env, qemu, command, perf))
    medians: dict[str, dict[str, float]] = {}
    for name, got in runs.items():
        keys = [k for k in got[0] if all(k in g for g in got)]
        medians[name] = {k: statistics.median(g[k] for g in got) for k in keys}
        print(name, " ".join(f"{k}={v:g}" for k, v in medians[name].items()))
    out = [f"{k}_{name}={v:g}" for name, m in medians.items() for k, v in m.items()]
    if len(variants) == 2:
        (_, ma), (_, mb) = medians.items()
        out += [f"{k}_b_over_a={mb[k] / ma[k]:.2f}" for k in ma if k in mb and ma[k]]
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
