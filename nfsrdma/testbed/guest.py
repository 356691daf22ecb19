"""Guest side of the test bed: bring up soft-RoCE and (optionally) knfsd, wait until knfsd
is out of its grace period, then run the host's command (or a shell) with ``TESTBED_*`` set.

Runs as root as ``python -m nfsrdma.testbed.guest SPEC.json`` inside the VM; the host's
root filesystem is visible read-only, the out directory is the only shared writable place.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from nfsrdma.testbed.constants import (
    ENV_ADDR,
    ENV_EXPORT,
    ENV_OUT,
    ENV_RXE,
    EXPORT_DIR,
    EXPORT_OPTIONS,
    EXPORT_SIZE,
    GUEST_ADDR,
    GUEST_PREFIX_LEN,
    KERNEL_LOG,
    KNFSD_GRACE_TIME,
    KNFSD_LEASE_TIME,
    KNFSD_RDMA_PORT,
    KNFSD_TCP_PORT,
    KNFSD_THREADS,
    NETDEV,
    RPC_PIPEFS,
    RXE_DEVICE,
    TIMINGS_FILE,
)
from nfsrdma.testbed.helpers import CommandError, run
from nfsrdma.testbed.spec import GuestSpec, SpecError

EXIT_SETUP_FAILED = 125

RXE_MODULES = ("dummy", "rdma_rxe", "ib_uverbs", "rdma_ucm")
KNFSD_MODULES = ("nfsd", "rpcrdma", "nfsv4")
TRACE_INSTANCE = Path("/sys/kernel/tracing/instances/nfsrdma-testbed")
GRACE_EVENT = "nfsd_grace_complete"
# A fresh (empty) client database on every boot, whatever the host's /var holds.
NFSDCLD_STORAGE = "/run/nfsrdma-nfsdcld"


class SetupError(RuntimeError):
    """The guest could not be brought to the promised state."""


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def say(msg: str) -> None:
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], timeout: float = 60.0) -> str:
    try:
        return run(argv, timeout=timeout).stdout
    except CommandError as exc:
        raise SetupError(str(exc)) from None
    except FileNotFoundError as exc:
        raise SetupError(f"{argv[0]}: not found ({exc}); see `nfsrdma testbed check`") from None


# ---------------------------------------------------------------------------------------------
# Kernel log → out dir


class KernelLog:
    """Copies ``/dev/kmsg`` to a file as messages arrive (kept off the console)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="kmsg", daemon=True)

    def start(self) -> KernelLog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _pump(self) -> None:
        try:
            fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            with open(self.path, "w", encoding="utf-8", errors="replace") as out:
                while True:
                    stopping = self._stop.is_set()
                    self._drain(fd, out)
                    if stopping:
                        return
                    select.select([fd], [], [], 0.5)
        finally:
            os.close(fd)

    @staticmethod
    def _drain(fd: int, out: TextIO) -> None:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten before we read them: skip ahead
                continue
            except OSError:
                break
            if not record:
                break
            out.write(format_kmsg(record.decode(errors="replace")))
        out.flush()


def format_kmsg(record: str) -> str:
    """One ``/dev/kmsg`` record (``prio,seq,usec,flags;text``) as a dmesg-like line."""
    head, _, body = record.partition(";")
    fields = head.split(",")
    text = body.split("\n", 1)[0]
    try:
        secs = int(fields[2]) / 1e6
    except (IndexError, ValueError):
        return text + "\n"
    return f"[{secs:12.6f}] {text}\n"


# ---------------------------------------------------------------------------------------------
# soft-RoCE


def load_modules(names: Sequence[str]) -> None:
    _run(["modprobe", "-a", *names], timeout=120)


def bring_up_rxe(addr: str = GUEST_ADDR) -> None:
    """A dummy netdev carrying ``addr`` and rxe0 on top of it (all inside the guest)."""
    script = (
        "link set lo up\n"
        f"link add {NETDEV} type dummy\n"
        f"addr add {addr}/{GUEST_PREFIX_LEN} dev {NETDEV}\n"
        f"link set {NETDEV} up\n"
    )
    try:
        run(["ip", "-batch", "-"], input=script, timeout=30)
    except CommandError as exc:
        raise SetupError(str(exc)) from None
    _run(["rdma", "link", "add", RXE_DEVICE, "type", "rxe", "netdev", NETDEV])
    state = Path(f"/sys/class/infiniband/{RXE_DEVICE}/ports/1/state")
    deadline = time.monotonic() + 15
    while True:
        with contextlib.suppress(OSError):
            if "ACTIVE" in state.read_text():
                break
        if time.monotonic() > deadline:
            raise SetupError(f"{RXE_DEVICE} did not become ACTIVE ({state})")
        time.sleep(0.1)
    if not Path("/dev/infiniband/rdma_cm").exists():
        raise SetupError("/dev/infiniband/rdma_cm missing (rdma_ucm not loaded?)")


# ---------------------------------------------------------------------------------------------
# knfsd


@dataclass(frozen=True, slots=True)
class KnfsdState:
    export: str
    grace: str  # "skipped" (no clients to reclaim), "ended" (seen), "waited" (timer fallback)
    ready_after_s: float


def _mount_once(fstype: str, source: str, target: str, options: str | None = None) -> None:
    Path(target).mkdir(parents=True, exist_ok=True)
    if os.path.ismount(target):
        return
    argv = ["mount", "-t", fstype, *(["-o", options] if options else []), source, target]
    _run(argv)


class GraceWatch:
    """Sees the end of knfsd's grace period through the ``nfsd_grace_complete`` tracepoint,
    in a private ftrace instance so that the global trace buffer stays untouched."""

    def __init__(self) -> None:
        self.armed = False

    def arm(self) -> None:
        try:
            TRACE_INSTANCE.mkdir(exist_ok=True)
            (TRACE_INSTANCE / "events/nfsd" / GRACE_EVENT / "enable").write_text("1\n")
            self.armed = True
        except OSError as exc:
            say(f"no grace tracepoint ({exc}); will wait the grace time out")

    def ended(self) -> bool:
        try:
            return GRACE_EVENT in (TRACE_INSTANCE / "trace").read_text()
        except OSError:
            return False

    def disarm(self) -> None:
        if not self.armed:
            return
        with contextlib.suppress(OSError):
            (TRACE_INSTANCE / "events/nfsd" / GRACE_EVENT / "enable").write_text("0\n")
        with contextlib.suppress(OSError):
            TRACE_INSTANCE.rmdir()
        self.armed = False


def kernel_says_grace_skipped() -> bool:
    out = run(["dmesg"], check=False, timeout=30).stdout
    return "skipping NFSv4 grace period" in out


def start_knfsd() -> KnfsdState:
    """knfsd with listeners on RDMA 20049 and TCP 2049, exporting a tmpfs as the NFSv4
    pseudo-root; returns once the grace period is over (an OPEN would otherwise stall)."""
    t0 = time.monotonic()
    _mount_once("nfsd", "nfsd", "/proc/fs/nfsd")
    _mount_once("rpc_pipefs", "sunrpc", RPC_PIPEFS)
    _mount_once("tmpfs", "tmpfs", EXPORT_DIR, f"size={EXPORT_SIZE},mode=1777")
    Path("/etc/exports").write_text(f"{EXPORT_DIR} *({EXPORT_OPTIONS})\n")
    Path(NFSDCLD_STORAGE).mkdir(parents=True, exist_ok=True)
    _run(["exportfs", "-ra"])
    _run(["rpc.mountd", "-N", "2", "-N", "3"])
    # nfsdcld tracks clients; with an empty database knfsd skips the grace period.
    _run(["nfsdcld", "-p", RPC_PIPEFS, "-s", NFSDCLD_STORAGE])
    Path("/proc/fs/nfsd/nfsv4leasetime").write_text(f"{KNFSD_LEASE_TIME}\n")
    Path("/proc/fs/nfsd/nfsv4gracetime").write_text(f"{KNFSD_GRACE_TIME}\n")
    watch = GraceWatch()
    watch.arm()
    try:
        _run(["rpc.nfsd", "-N", "3", f"--rdma={KNFSD_RDMA_PORT}", str(KNFSD_THREADS)])
        started = time.monotonic()
        portlist = Path("/proc/fs/nfsd/portlist").read_text()
        for want in (f"rdma {KNFSD_RDMA_PORT}", f"tcp {KNFSD_TCP_PORT}"):
            if want not in portlist:
                raise SetupError(f"knfsd is not listening on {want}: portlist={portlist!r}")
        grace = _wait_grace(watch, started)
    finally:
        watch.disarm()
    return KnfsdState(EXPORT_DIR, grace, time.monotonic() - t0)


def _wait_grace(watch: GraceWatch, started: float) -> str:
    if kernel_says_grace_skipped():
        return "skipped"
    limit = started + KNFSD_GRACE_TIME + 15
    if watch.armed:
        while time.monotonic() < limit:
            if watch.ended():
                return "ended"
            time.sleep(0.2)
        raise SetupError(f"knfsd still in its grace period after {KNFSD_GRACE_TIME + 15} s")
    time.sleep(max(0.0, started + KNFSD_GRACE_TIME + 1 - time.monotonic()))
    return "waited"


# ---------------------------------------------------------------------------------------------
# Running the command


def command_env(spec: GuestSpec) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_ADDR] = GUEST_ADDR
    env[ENV_OUT] = spec.out_dir
    env[ENV_RXE] = RXE_DEVICE
    if spec.knfsd:
        env[ENV_EXPORT] = EXPORT_DIR
    else:
        env.pop(ENV_EXPORT, None)
    env["PATH"] = os.pathsep.join([*spec.path_prepend, env.get("PATH", "/usr/sbin:/usr/bin")])
    env["PYTHONUNBUFFERED"] = "1"  # stream output to the host as it happens
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the checkout is read-only here
    env.update(spec.env)
    return env


def exit_code(returncode: int) -> int:
    """A shell-style exit code from ``Popen.returncode`` (negative = killed by a signal)."""
    return 128 - returncode if returncode < 0 else returncode


def run_command(argv: Sequence[str], env: dict[str, str], cwd: str) -> int:
    try:
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd)
    except OSError as exc:
        say(f"cannot run {argv[0]}: {exc}")
        return 127
    return exit_code(proc.wait())


def run_shell(env: dict[str, str], cwd: str) -> int:
    # Not $SHELL: virtme-ng starts this very program as the user's shell (su -s).
    shell = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
    env = {**env, "SHELL": shell}
    banner = [f"{k}={env[k]}" for k in (ENV_ADDR, ENV_EXPORT, ENV_OUT, ENV_RXE) if k in env]
    say("shell ready; " + " ".join(banner) + "; exit to power off")
    # The shell takes the terminal; this process only waits.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return exit_code(subprocess.call([shell, "-i"], env=env, cwd=cwd))
    finally:
        signal.signal(signal.SIGINT, old)


def write_timings(out: Path, timings: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        (out / TIMINGS_FILE).write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")


def session(spec: GuestSpec) -> int:
    out = Path(spec.out_dir)
    boot_s = uptime()
    say(f"guest up ({boot_s:.1f} s since kernel start)")
    timings: dict[str, object] = {"guest_boot_s": round(boot_s, 2), "knfsd": spec.knfsd}
    klog = KernelLog(out / KERNEL_LOG).start()
    try:
        try:
            t = time.monotonic()
            load_modules(RXE_MODULES + (KNFSD_MODULES if spec.knfsd else ()))
            bring_up_rxe()
            timings["rxe_s"] = round(time.monotonic() - t, 2)
            msg = f"{RXE_DEVICE} up on {GUEST_ADDR} ({timings['rxe_s']} s)"
            if spec.knfsd:
                state = start_knfsd()
                timings["knfsd_ready_s"] = round(state.ready_after_s, 2)
                timings["knfsd_grace"] = state.grace
                msg += (
                    f"; knfsd ready on rdma {KNFSD_RDMA_PORT} / tcp {KNFSD_TCP_PORT} "
                    f"({state.ready_after_s:.1f} s, grace {state.grace})"
                )
            timings["setup_done_uptime_s"] = round(uptime(), 2)
            say(msg)
        except (SetupError, OSError) as exc:
            say(f"set-up FAILED: {exc}")
            timings["setup_error"] = str(exc)
            write_timings(out, timings)
            return EXIT_SETUP_FAILED
        write_timings(out, timings)
        env = command_env(spec)
        t = time.monotonic()
        rc = run_shell(env, spec.cwd) if spec.shell else run_command(spec.command, env, spec.cwd)
        timings["command_s"] = round(time.monotonic() - t, 2)
        timings["exit_code"] = rc
        write_timings(out, timings)
        return rc
    finally:
        klog.stop()
        os.sync()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nfsrdma.testbed.guest", description=__doc__)
    parser.add_argument("spec", type=Path, help="the JSON spec the host wrote")
    args = parser.parse_args(argv)
    try:
        spec = GuestSpec.load(args.spec)
    except (OSError, SpecError) as exc:
        say(f"bad spec {args.spec}: {exc}")
        return EXIT_SETUP_FAILED
    if os.geteuid() != 0:
        say("must run as root inside the test-bed guest")
        return EXIT_SETUP_FAILED
    return session(spec)


if __name__ == "__main__":
    sys.exit(main())
