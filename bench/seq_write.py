"""The Linux client's sequential write (then fsync) to our server and to knfsd, in one boot,
with what the client sent (issue 12).

For each transport (``--proto tcp,rdma``) both servers are mounted at once and the write of
``--size-mib`` MiB (1 MiB ``write`` calls, then ``fsync``, as ``nfsbench.sequential``) runs
``--rounds`` times on each, taking turns (knfsd first in odd rounds). Per run: MB/s; the
client's WRITE and COMMIT calls and bytes, their mean round trip and execution time
(``/proc/self/mountstats``); the mount's wsize; with ``--trace`` the kernel's NFS tracepoints
(what each WRITE asked, ``stable`` and what came back as ``committed``, WRITEs in flight, and
over RDMA the Read chunk segments the client registered); our server's CPU per COMPOUND and
the guest's CPU split (``nfsbench.CpuSplit``). ``--profile`` / ``--strace`` as ``nfsbench``.

Last line: ``seq_write=… ours_mb_s=… knfsd_mb_s=…`` per transport (medians of the rounds;
``seq_write`` is the median of the per-round ratios). Run on the host: it boots the test bed
itself (``--out``, ``--timeout``); inside the guest (``nfsrdma testbed run ... --``) it runs at
once, so several trees can be measured in one boot (``cd TREE && PYTHONPATH=TREE python
THIS_TREE/bench/seq_write.py``: the server is that tree's)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from nfsbench import CHUNK, CpuSplit, ServerProbe, step, write_seconds

from nfsrdma.testbed.helpers import (
    Knfsd,
    NfsServer,
    Proto,
    artefact_dir,
    export_dir,
    in_testbed,
    mount_nfs,
    testbed_addr,
)
from nfsrdma.testbed.ours import our_server

MOUNT_ROOT = Path("/tmp/seqw-mnt")
TRACING = Path("/sys/kernel/tracing")
EVENTS = (
    "nfs/nfs_initiate_write",
    "nfs/nfs_writeback_done",
    "nfs/nfs_initiate_commit",
    "nfs/nfs_commit_done",
    "rpcrdma/xprtrdma_chunk_read",
    "rpcrdma/xprtrdma_marshal",
)
_KV = re.compile(r"(\w+)=(\S+)")
_STAMP = re.compile(r"\s(\d+\.\d+): (\w+):")
_SEG = re.compile(r" (\d+)@0x")


def op_counts(mountpoint: Path) -> dict[str, list[int]]:
    """Per-operation counters of one mount (``/proc/self/mountstats``): ops, transmissions,
    timeouts, bytes sent, bytes received, queue, rtt, execute (ms totals)."""
    want = os.path.realpath(mountpoint)
    text = Path("/proc/self/mountstats").read_text()
    out: dict[str, list[int]] = {}
    inside = False
    for line in text.splitlines():
        if line.startswith("device "):
            inside = f" mounted on {want} " in line
            continue
        if inside and line.startswith("\t") and ":" in line:
            key, _, rest = line.strip().partition(":")
            values = rest.split()
            if key in ("WRITE", "COMMIT") and len(values) >= 8:
                out[key] = [int(v) for v in values[:8]]
            elif key == "opts":
                wsize = re.search(r"wsize=(\d+)", rest)
                out["wsize"] = [int(wsize.group(1))] if wsize else [0]
    return out


class Trace:
    """The kernel's NFS client tracepoints around one run (tracefs; silently off if absent)."""

    def __init__(self, on: bool) -> None:
        self.on = False
        if not on:
            return
        if not (TRACING / "trace").exists():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACING)], check=False)
        if not (TRACING / "trace").exists():
            step("no tracefs: no tracepoints")
            return
        (TRACING / "buffer_size_kb").write_text("16384\n")
        for ev in EVENTS:
            path = TRACING / "events" / ev / "enable"
            if path.exists():
                path.write_text("1\n")
            else:
                step(f"no tracepoint {ev}")
        self.on = True

    def clear(self) -> None:
        if self.on:
            (TRACING / "trace").write_text("")

    def collect(self, out: Path) -> dict[str, Any]:
        if not self.on:
            return {}
        text = (TRACING / "trace").read_text()
        out.write_text(text)
        return summarise(text)


def summarise(text: str) -> dict[str, Any]:
    """What the client asked and got: stable_how of WRITEs, committed in replies, sizes,
    WRITEs in flight (max and time-weighted mean), COMMITs, Read chunk segments."""
    asked: Counter[str] = Counter()
    got: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    verifiers: set[str] = set()
    commits = 0
    segs: Counter[int] = Counter()
    edges: list[tuple[float, int]] = []
    for line in text.splitlines():
        m = _STAMP.search(line)
        if m is None:
            continue
        t, ev = float(m.group(1)), m.group(2)
        kv = dict(_KV.findall(line))
        if ev == "nfs_initiate_write":
            asked[kv.get("stable", "?")] += 1
            sizes[int(kv.get("count", "0"))] += 1
            edges.append((t, 1))
        elif ev == "nfs_writeback_done":
            got[kv.get("stable", "?")] += 1
            verifiers.add(kv.get("verifier", "?"))
            edges.append((t, -1))
        elif ev == "nfs_initiate_commit":
            commits += 1
        elif ev == "xprtrdma_chunk_read":
            for s in _SEG.findall(line):
                segs[int(s)] += 1
    depth, peak, area = 0, 0, 0.0
    edges.sort()
    ends = [t for t, _ in edges[1:]] + ([edges[-1][0]] if edges else [])
    for (t0, d), t1 in zip(edges, ends, strict=True):
        depth += d
        peak = max(peak, depth)
        area += depth * (t1 - t0)
    span = edges[-1][0] - edges[0][0] if len(edges) > 1 else 0.0
    return {
        "stable_asked": dict(asked),
        "committed_got": dict(got),
        "write_sizes": {str(k): v for k, v in sizes.most_common(4)},
        "verifiers": len(verifiers),
        "commits": commits,
        "in_flight_max": peak,
        "in_flight_mean": round(area / span, 2) if span else 0.0,
        "read_segments": {str(k): v for k, v in segs.most_common(4)},
    }


def write_file(mnt: Path, size_mib: int) -> float:
    """MB/s of ``size_mib`` 1 MiB writes and an fsync."""
    return size_mib * CHUNK / write_seconds(mnt / "seqw.bin", size_mib) / 1e6


def one_proto(proto: str, args: argparse.Namespace, trace: Trace) -> dict[str, list[float]]:
    knfsd = Knfsd(addr=testbed_addr(), export=export_dir())
    name = f"seqw-{proto}" + (f"-{args.tag}" if args.tag else "")
    rates: dict[str, list[float]] = {"theirs": [], "mine": []}
    with our_server(f"seqw-{proto}", rdma=proto == "rdma") as ours:
        probe = ServerProbe(
            ours.pid, ours.state_dir, name, profile=args.profile, strace=args.strace
        )
        split = CpuSplit(ours.pid, name)
        kind: Proto = "rdma" if proto == "rdma" else "tcp"
        servers: dict[str, NfsServer] = {"theirs": knfsd.server(kind), "mine": ours.server(kind)}
        with (
            mount_nfs(servers["theirs"], MOUNT_ROOT / "theirs") as mt,
            mount_nfs(servers["mine"], MOUNT_ROOT / "mine") as mm,
        ):
            mounts = {"theirs": mt.mountpoint, "mine": mm.mountpoint}
            for r in range(args.rounds):
                for n in ("theirs", "mine") if r % 2 == 0 else ("mine", "theirs"):
                    with contextlib.suppress(FileNotFoundError):
                        (mounts[n] / "seqw.bin").unlink()
                    os.sync()
                    before = op_counts(mounts[n])
                    snap = split.snapshot()
                    trace.clear()
                    ctx = probe.phase(f"write{r + 1}") if n == "mine" else None
                    with ctx or contextlib.nullcontext():
                        rate = write_file(mounts[n], args.size_mib)
                    split.record(f"write{r + 1}", n, snap, split.snapshot(), args.size_mib)
                    after = op_counts(mounts[n])
                    summary = trace.collect(artefact_dir(name) / f"trace-{n}-{r + 1}.txt")
                    rates[n].append(rate)
                    report(proto, n, r + 1, rate, before, after, summary)
            if probe.cpu_ms:
                print(f"{proto} {probe.line()}", flush=True)
    return rates


def report(
    proto: str,
    who: str,
    rnd: int,
    rate: float,
    before: dict[str, list[int]],
    after: dict[str, list[int]],
    summary: dict[str, Any],
) -> None:
    parts = [f"{proto} {who} round {rnd}: {rate:.1f} MB/s wsize={after.get('wsize', [0])[0]}"]
    for op in ("WRITE", "COMMIT"):
        a, b = after.get(op, [0] * 8), before.get(op, [0] * 8)
        d = [x - y for x, y in zip(a, b, strict=True)]
        if d[0]:
            parts.append(
                f"{op} n={d[0]} sent={d[3] / 1e6:.1f}MB rtt={d[6] / d[0]:.1f}ms "
                f"exec={d[7] / d[0]:.1f}ms queue={d[5] / d[0]:.1f}ms"
            )
    if summary:
        parts.append(" ".join(f"{k}={v}" for k, v in summary.items()))
    print(" | ".join(parts), flush=True)


def in_guest(args: argparse.Namespace) -> int:
    trace = Trace(args.trace)
    lines = []
    for proto in args.proto.split(","):
        step(f"sequential write over {proto}")
        rates = one_proto(proto, args, trace)
        ratios = [m / t for m, t in zip(rates["mine"], rates["theirs"], strict=True)]
        lines.append(
            f"{proto}_seq_write={statistics.median(ratios):.2f} "
            f"{proto}_ours_mb_s={statistics.median(rates['mine']):.1f} "
            f"{proto}_knfsd_mb_s={statistics.median(rates['theirs']):.1f} "
            f"{proto}_ratios={','.join(f'{x:.2f}' for x in ratios)}"
        )
    print(" ".join(lines), flush=True)
    return 0


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=16, help="file size (16 MiB)")
    p.add_argument("--rounds", type=int, default=3, help="runs on each server, taking turns")
    p.add_argument("--proto", default="tcp,rdma", help="transports, in order (tcp,rdma)")
    p.add_argument("--trace", action="store_true", help="the kernel's NFS client tracepoints")
    p.add_argument("--profile", action="store_true", help="py-spy on our server per run")
    p.add_argument("--strace", action="store_true", help="strace -c of our server per run")
    p.add_argument("--tag", default="", help="names the artefacts (artefacts/seqw-<proto>-<tag>)")
    p.add_argument("--out", type=Path, default=None, help="host only: results directory")
    p.add_argument("--timeout", type=float, default=1200.0, help="host only: VM time limit")
    return p


def main() -> int:
    args = arguments().parse_args()
    if in_testbed():
        return in_guest(args)
    here = Path(__file__).resolve()
    forward = [
        "--size-mib", str(args.size_mib), "--rounds", str(args.rounds), "--proto", args.proto,
        *(["--trace"] if args.trace else []), *(["--profile"] if args.profile else []),
        *(["--strace"] if args.strace else []), *([f"--tag={args.tag}"] if args.tag else []),
    ]  # fmt: skip
    argv = [
        sys.executable, "-m", "nfsrdma.testbed", "run", "--knfsd",
        "--out", str(args.out or Path("testbed-out") / here.stem),
        "--timeout", str(args.timeout), "--", sys.executable, str(here), *forward,
    ]  # fmt: skip
    return subprocess.call(argv, cwd=here.parent.parent)


if __name__ == "__main__":
    sys.exit(main())
