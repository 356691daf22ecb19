"""What the server benchmarks measure through a Linux NFS mount, and how they run in the VM.

Used by ``server_tcp.py``, ``server_rdma.py`` and ``server_peer.py``: each boots the test bed once, starts our
server next to knfsd, and measures both the same way, through the Linux client:

- sequential write of one file (then fsync) and read after dropping caches, MB/s;
- 4 KiB random reads with O_DIRECT (every read reaches the server) for a fixed time, from 4
  threads, reads/s;
- create + stat + remove of N files, operations/s (3 per file).

Absolute numbers under qemu TCG mean little; the ratio ours / knfsd within one boot does. The
guest's speed drifts with the host's load (several-fold within minutes on a shared machine), so
``measure_both`` mounts both servers at once and runs each phase on one and then the other,
``--rounds`` times with the order swapped each round; each figure is the median of its rounds.
Before the first round each mount gets a small unmeasured pass of every phase (``warm_up``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.testbed.helpers import NfsServer, artefact_dir, drop_caches, mount_nfs
from nfsrdma.testbed.ours import OurServer

CHUNK = 1 << 20
MOUNT_ROOT = Path("/tmp/bench-mnt")


@dataclass
class Figures:
    seq_write: float = 0.0  # MB/s
    seq_read: float = 0.0  # MB/s
    rand_read: float = 0.0  # 4 KiB reads/s
    meta: float = 0.0  # create/stat/remove operations/s


def write_seconds(path: Path, size_mib: int) -> float:
    """Seconds to write ``path`` afresh with ``size_mib`` 1 MiB ``write`` calls and ``fsync``."""
    block = os.urandom(CHUNK)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(size_mib):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t


def sequential(mnt: Path, size_mib: int) -> tuple[float, float]:
    path = mnt / "seq.bin"
    write_s = write_seconds(path, size_mib)
    drop_caches()
    t = time.perf_counter()
    got = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while data := os.read(fd, CHUNK):
            got += len(data)
    finally:
        os.close(fd)
    read_s = time.perf_counter() - t
    if got != size_mib * CHUNK:
        raise RuntimeError(f"read {got} bytes back, wrote {size_mib * CHUNK}")
    n = size_mib * CHUNK
    return n / write_s / 1e6, n / read_s / 1e6


def random_reads(mnt: Path, seconds: float, threads: int = 4) -> float:
    """4 KiB O_DIRECT reads at random aligned offsets of seq.bin, for ``seconds``."""
    path = mnt / "seq.bin"
    size = path.stat().st_size
    blocks = size // 4096
    counts = [0] * threads
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        rng = random.Random(i)
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while time.perf_counter() < deadline:
                os.preadv(fd, [buf], rng.randrange(blocks) * 4096)
                counts[i] += 1
        finally:
            os.close(fd)

    t = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return sum(counts) / (time.perf_counter() - t)


def metadata(mnt: Path, files: int) -> float:
    d = mnt / "meta"
    d.mkdir(exist_ok=True)
    names = [d / f"f{i:04d}" for i in range(files)]
    t = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    drop_caches()  # stat must ask the server
    for p in names:
        os.stat(p)
    for p in names:
        os.unlink(p)
    return 3 * files / (time.perf_counter() - t)


class ServerProbe:
    """Looks into our server during each phase: the CPU seconds its process used per COMPOUND
        (``/proc/<pid>/stat``; under TCG with other load on the host it varies about 2x between runs
    too, so compare it over several runs), a py-spy
        profile (``--profile``: every thread, idle time included, collapsed stacks) and its
        per-operation figures (``nfsrdma stats --json``: calls, mean and p99 latency), written to
        ``artefacts/<name>/``; ``cpu_ms`` holds the CPU milliseconds per COMPOUND of each phase."""

    def __init__(
        self,
        pid: int,
        state_dir: str,
        name: str,
        *,
        profile: bool,
        strace: bool = False,
        native: bool = False,
    ) -> None:
        self.pid = pid
        self.native = native
        self.state_dir = state_dir
        self.dir = artefact_dir(name)
        self.cpu_ms: dict[str, float] = {}
        self._spent: dict[str, tuple[float, int]] = {}  # per phase, over rounds: (CPU s, COMPOUNDs)
        self.py_spy = shutil.which("py-spy") if profile else None
        if profile and self.py_spy is None:
            step("py-spy not found: no profile")
        self.strace = shutil.which("strace") if strace else None
        if strace and self.strace is None:
            step("strace not found: no system-call counts")

    @contextlib.contextmanager
    def phase(self, label: str) -> Iterator[None]:
        spy = None
        if self.py_spy is not None:
            argv = [
                self.py_spy, "record", "--pid", str(self.pid), "--rate", "97", "--idle",
                "--threads", "--format", "raw",
                # (py-spy cannot unwind native stacks without pausing the process)
                *(["--native"] if self.native else ["--nonblocking"]),
                "--output", str(self.dir / f"{label}.collapsed"),
            ]  # fmt: skip
            log = open(self.dir / f"{label}.py-spy.log", "wb")  # noqa: SIM115
            spy = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            time.sleep(1.0)  # attached before the phase starts
        tracer = None
        if self.strace is not None:
            # every thread's system calls, counted (strace slows the server: figures of a
            # phase traced are not comparable with untraced ones)
            argv = [self.strace, "-c", "-f", "-p", str(self.pid),
                    "-o", str(self.dir / f"{label}.strace")]  # fmt: skip
            tracer = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        cpu0, compounds0 = self._cpu_s(), self._compounds(self._stats())
        try:
            yield
        finally:
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                try:
                    tracer.wait(60)
                except subprocess.TimeoutExpired:
                    tracer.kill()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                try:
                    spy.wait(60)
                except subprocess.TimeoutExpired:
                    spy.kill()
            snap = self._stats()
            if snap is not None:
                (self.dir / f"{label}.stats.json").write_text(json.dumps(snap, indent=1) + "\n")
            cpu, count = self._spent.get(label, (0.0, 0))
            cpu += self._cpu_s() - cpu0
            count += self._compounds(snap) - compounds0
            self._spent[label] = (cpu, count)
            if count > 0:
                self.cpu_ms[label] = cpu * 1000 / count
                (self.dir / f"{label}.compounds").write_text(f"{count}\n")

    def _cpu_s(self) -> float:
        """User and system CPU seconds of the server process (every thread) so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _compounds(snap: dict[str, Any] | None) -> int:
        if snap is None:
            return 0
        return sum(int(t.get("compounds", 0)) for t in snap.get("transports", {}).values())

    def _stats(self) -> dict[str, Any] | None:
        from nfsrdma.stats.admin import query, socket_path

        try:
            snap: dict[str, Any] = query(socket_path(self.state_dir))["stats"]
        except (OSError, ValueError, KeyError) as e:
            step(f"server stats: {e}")
            return None
        return snap

    def line(self) -> str:
        """``cpu_ms_per_compound seq=… rand_read=… meta=…`` (our server, this run)."""
        return "our server's CPU ms per COMPOUND: " + " ".join(
            f"{k}={v:.2f}" for k, v in self.cpu_ms.items()
        )


class CpuSplit:
    """Where the guest's CPU went during each phase, for either server: every CPU's user,
    system and softirq time (``/proc/stat``), our server's per thread (user and system,
    ``/proc/<pid>/task/*/stat``), knfsd's ``nfsd`` threads, this process (the Linux client's
    system calls run in it), and the other kernel threads (rxe, rpciod, kworkers, ksoftirqd),
    in ms per operation of the phase; ``artefacts/<name>/cpu-split.jsonl``, one line a phase."""

    def __init__(self, our_pid: int | None, name: str) -> None:
        self.our_pid = our_pid
        self.path = artefact_dir(name) / "cpu-split.jsonl"
        self.tick_ms = 1000 / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _stat(path: str) -> tuple[str, int, int, int] | None:
        """(comm, ppid, utime, stime) of one /proc stat file."""
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return None
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        return head.partition("(")[2], int(fields[1]), int(fields[11]), int(fields[12])

    def snapshot(self) -> dict[str, Any]:
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        snap: dict[str, Any] = {"cpu": cpu, "threads": {}, "nfsd": [0, 0], "kthreads": {}}
        if self.our_pid is not None:
            for tid in os.listdir(f"/proc/{self.our_pid}/task"):
                got = self._stat(f"/proc/{self.our_pid}/task/{tid}/stat")
                if got is not None:
                    snap["threads"][f"{got[0]}:{tid}"] = [got[2], got[3]]
        me = self._stat("/proc/self/stat")
        snap["self"] = [me[2], me[3]] if me else [0, 0]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            got = self._stat(f"/proc/{pid}/stat")
            if got is None or got[1] != 2:  # kernel threads only (children of kthreadd)
                continue
            if got[0] == "nfsd":
                snap["nfsd"][0] += got[2]
                snap["nfsd"][1] += got[3]
            else:
                key = got[0].split("/")[0]
                old = snap["kthreads"].get(key, [0, 0])
                snap["kthreads"][key] = [old[0] + got[2], old[1] + got[3]]
        return snap

    def record(
        self, label: str, who: str, before: dict[str, Any], after: dict[str, Any], ops: float
    ) -> None:
        ms = self.tick_ms
        names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
        cpu = {n: (b - a) * ms for n, a, b in zip(names, before["cpu"], after["cpu"], strict=False)}
        threads = {
            k: [(v[0] - before["threads"].get(k, [0, 0])[0]) * ms,
                (v[1] - before["threads"].get(k, [0, 0])[1]) * ms]
            for k, v in after["threads"].items()
        }  # fmt: skip
        kthreads = {
            k: (sum(v) - sum(before["kthreads"].get(k, [0, 0]))) * ms
            for k, v in after["kthreads"].items()
        }
        line = {
            "phase": label,
            "server": who,
            "ops": ops,
            "cpu_ms": cpu,
            "threads_ms": {k: v for k, v in threads.items() if v[0] or v[1]},
            "nfsd_ms": [(b - a) * ms for a, b in zip(before["nfsd"], after["nfsd"], strict=True)],
            "self_ms": [(b - a) * ms for a, b in zip(before["self"], after["self"], strict=True)],
            "kthreads_ms": {k: v for k, v in sorted(kthreads.items()) if v},
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        busy = sum(v for k, v in cpu.items() if k not in ("idle", "iowait", "steal"))
        ours = sum(a + b for a, b in threads.values())
        step(
            f"cpu {label} {who}: {ops:.0f} ops, guest busy {busy / max(ops, 1):.2f} ms/op "
            f"(user {cpu['user'] / max(ops, 1):.2f}, sys {cpu['system'] / max(ops, 1):.2f}, "
            f"softirq {cpu['softirq'] / max(ops, 1):.2f}), our server {ours / max(ops, 1):.2f}, "
            f"nfsd {sum(line['nfsd_ms']) / max(ops, 1):.2f}, bench process "
            f"{sum(line['self_ms']) / max(ops, 1):.2f} ms/op"
        )


PHASES = ("seq", "rand_read", "meta")


def warm_up(mnt: Path) -> None:
    """A small pass of every phase on a new mount, not measured. A mount's first use pays
    once-only costs (in the test bed, above all the emulator translating the code each
    server runs for the first time; knfsd's first sequential read came out at a tenth of its
    later ones), which would otherwise fall on whichever server's first phase ran first."""
    sequential(mnt, 2)
    random_reads(mnt, 0.5)
    metadata(mnt, 10)


def run_phase(label: str, mnt: Path, args: argparse.Namespace, f: Figures) -> None:
    if label == "seq":
        f.seq_write, f.seq_read = sequential(mnt, args.size_mib)
    elif label == "rand_read":
        f.rand_read = random_reads(mnt, args.seconds)
    else:
        f.meta = metadata(mnt, args.files)


def measure_both(
    theirs: NfsServer,
    mine: NfsServer,
    args: argparse.Namespace,
    probe: ServerProbe | None = None,
    split: CpuSplit | None = None,
) -> tuple[Figures, Figures]:
    """(theirs, mine): both mounted at once, each phase run on one then the other, ``--rounds``
    times (the order swapped each round: theirs first in round 1); medians of the rounds."""
    names = ("theirs", "mine")
    rounds: dict[str, list[Figures]] = {n: [] for n in names}
    with (
        mount_nfs(theirs, MOUNT_ROOT / "theirs") as mt,
        mount_nfs(mine, MOUNT_ROOT / "mine") as mm,
    ):
        mounts = {"theirs": mt.mountpoint, "mine": mm.mountpoint}
        for n in names:
            step(f"warm-up on {n}")
            warm_up(mounts[n])
        for r in range(args.rounds):
            figures = {n: Figures() for n in names}
            for label in PHASES:
                for n in names if r % 2 == 0 else names[::-1]:
                    step(f"round {r + 1}/{args.rounds}: {label} on {n}")
                    ctx = probe.phase(label) if probe is not None and n == "mine" else None
                    before = split.snapshot() if split is not None else None
                    with ctx or contextlib.nullcontext():
                        run_phase(label, mounts[n], args, figures[n])
                    if split is not None and before is not None:
                        split.record(
                            label, n, before, split.snapshot(), _ops(label, args, figures[n])
                        )
            for n in names:
                rounds[n].append(figures[n])
        for n in names:
            (mounts[n] / "seq.bin").unlink()
    return _median(rounds["theirs"]), _median(rounds["mine"])


def measure_ours(
    theirs: NfsServer, ours: OurServer, proto: str, args: argparse.Namespace
) -> tuple[Figures, Figures, ServerProbe]:
    """``measure_both`` of knfsd and our server over ``proto``, our server probed (artefacts
    in ``ours-<proto>[-<tag>]``): (theirs, mine, the probe)."""
    name = "-".join([f"ours-{proto}", *([args.tag] if args.tag else [])])
    probe = ServerProbe(
        ours.pid,
        ours.state_dir,
        name,
        profile=args.profile,
        strace=args.strace,
        native=args.native,
    )
    split = CpuSplit(ours.pid, name)
    them, mine = measure_both(theirs, ours.server(proto), args, probe, split)
    return them, mine, probe


def _ops(label: str, args: argparse.Namespace, f: Figures) -> float:
    """Operations a phase made: MiB written and read (seq), 4 KiB reads, create/stat/remove."""
    if label == "seq":
        return 2.0 * args.size_mib
    return f.rand_read * args.seconds if label == "rand_read" else 3.0 * args.files


def _median(runs: list[Figures]) -> Figures:
    return Figures(
        *(
            statistics.median(getattr(f, k) for f in runs)
            for k in ("seq_write", "seq_read", "rand_read", "meta")
        )
    )


def ratio_line(mine: Figures, theirs: Figures, **extra: float) -> str:
    """``seq_write=… seq_read=… rand_read=… meta=…`` (ours / theirs), then any ``extra``."""
    parts = {
        "seq_write": mine.seq_write / theirs.seq_write,
        "seq_read": mine.seq_read / theirs.seq_read,
        "rand_read": mine.rand_read / theirs.rand_read,
        "meta": mine.meta / theirs.meta,
        **extra,
    }
    return " ".join(f"{k}={v:.2f}" for k, v in parts.items())


def table(rows: list[tuple[str, Figures]]) -> None:
    width = max(len(n) for n, _ in rows)
    print(
        f"{'server'.ljust(width)}  {'write MB/s':>10} {'read MB/s':>10} {'4K rand/s':>10} {'meta op/s':>10}"
    )
    for name, f in rows:
        print(
            f"{name.ljust(width)}  {f.seq_write:10.1f} {f.seq_read:10.1f} "
            f"{f.rand_read:10.0f} {f.meta:10.0f}"
        )


def step(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def arguments(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=64, help="sequential file size (64 MiB)")
    p.add_argument("--seconds", type=float, default=10.0, help="random-read time (10 s)")
    p.add_argument("--files", type=int, default=500, help="files for create/stat/remove")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of every phase on both servers, taking turns (medians are reported)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile our server with py-spy in each phase (artefacts/; numbers drop a little)",
    )
    p.add_argument(
        "--strace",
        action="store_true",
        help="count our server's system calls with strace -c in each phase (artefacts/<phase>"
        ".strace, with <phase>.compounds; strace slows the server a lot: figures drop)",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="with --profile: py-spy --native (C frames too; pauses the server to sample)",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for our server (e.g. --serve-arg=--no-delegations; repeatable)",
    )
    p.add_argument(
        "--root-squash",
        action="store_true",
        help="our server squashes root (every call of the root client is an identity switch; "
        "knfsd does not squash: compare our figures between runs, not the ratio)",
    )
    p.add_argument(
        "--tag", default="", help="names this run's artefacts (artefacts/ours-<proto>-<tag>/)"
    )
    p.add_argument("--out", type=Path, default=None, help="host only: results directory")
    p.add_argument("--timeout", type=float, default=1800.0, help="host only: VM time limit")
    return p


def run_in_testbed(script: str, args: argparse.Namespace, forward: list[str]) -> int:
    """Boot the test bed (with knfsd) and run ``script`` inside it with ``forward`` arguments."""
    here = Path(script).resolve()
    out = args.out or Path("testbed-out") / here.stem
    argv = [
        sys.executable, "-m", "nfsrdma.testbed", "run", "--knfsd", "--out", str(out),
        "--timeout", str(args.timeout), "--", sys.executable, str(here), *forward,
    ]  # fmt: skip
    return subprocess.call(argv, cwd=here.parent.parent)


def forwarded(args: argparse.Namespace) -> list[str]:
    return [
        "--size-mib", str(args.size_mib), "--seconds", str(args.seconds),
        "--files", str(args.files), "--rounds", str(args.rounds),
        *(["--profile"] if args.profile else []),
        *(["--strace"] if args.strace else []),
        *(["--native"] if args.native else []),
        *(f"--serve-arg={a}" for a in args.serve_arg),
        *(["--root-squash"] if args.root_squash else []),
        *([f"--tag={args.tag}"] if args.tag else []),
    ]  # fmt: skip


Main = Callable[[argparse.Namespace], int]
