"""Host side of the test bed: find the kernel and ``vng``, build the virtme-ng command,
boot the guest, stream its output, enforce a timeout, return the guest command's exit code.

The guest gets no network device (virtme-ng's default ``-net none``), the host's root
read-only, and one shared writable directory: the out directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

import nfsrdma
from nfsrdma.testbed.constants import (
    CONSOLE_LOG,
    KERNEL_LOG,
    OUT_MARKER,
    SHELL_SCRIPT,
    SPEC_FILE,
    TIMINGS_FILE,
)
from nfsrdma.testbed.spec import GuestSpec

EXIT_TIMEOUT = 124
EXIT_MISSING = 127
KERNEL_ENV = "NFSRDMA_TESTBED_KERNEL"
# The 6.1 kernel must not load kvm inside the TCG guest (it aborts qemu on an MSR).
KERNEL_APPEND = "module_blacklist=kvm,kvm_amd,kvm_intel"
# The guest's first line (guest.session): the boot is over when the host sees it.
BANNER = b"testbed: guest up"
_UNSAFE_PATH = re.compile(r"[\s,=\"'\\]")


class TestbedError(RuntimeError):
    """The test bed cannot start; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Discovery


def _version_key(path: Path) -> tuple[tuple[int, str], ...]:
    parts = re.split(r"[.-]", path.name.removeprefix("vmlinuz-"))
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in parts)


def find_kernel(boot: Path = Path("/boot")) -> Path | None:
    """``$NFSRDMA_TESTBED_KERNEL``, else the newest readable ``/boot/vmlinuz-*``."""
    env = os.environ.get(KERNEL_ENV)
    if env:
        return Path(env) if os.access(env, os.R_OK) else None
    images = sorted(boot.glob("vmlinuz-*"), key=_version_key, reverse=True)
    return next((p for p in images if os.access(p, os.R_OK)), None)


def kernel_release(kernel: Path) -> str:
    return kernel.name.removeprefix("vmlinuz-")


def venv_bin() -> Path:
    return Path(sys.executable).parent


def find_vng() -> str | None:
    """``vng`` next to this Python (the venv), else on ``PATH``."""
    local = venv_bin() / "vng"
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("vng")


def checkout_dir() -> Path:
    """The checkout this package runs from (its parent holds pyproject.toml), else the cwd."""
    root = Path(nfsrdma.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").exists() else Path.cwd()


# ---------------------------------------------------------------------------------------------
# The command


@dataclass(frozen=True, slots=True)
class VmConfig:
    kernel: Path
    vng: str
    out_dir: Path
    cwd: Path
    memory: str = "4G"
    cpus: int = 2
    timeout_s: float | None = 1800.0
    extra_append: tuple[str, ...] = field(default_factory=tuple)
    qemu_opts: tuple[str, ...] = field(default_factory=tuple)


def vng_argv(cfg: VmConfig, *, exec_cmd: str | None = None, shell: Path | None = None) -> list[str]:
    """The ``vng`` command line: TCG, no network, the out dir shared read-write."""
    for p in (cfg.out_dir, cfg.cwd):
        if _UNSAFE_PATH.search(str(p)):
            raise TestbedError(
                f"path {str(p)!r} has characters the guest cannot mount; use another"
            )
    argv = [
        cfg.vng,
        "--disable-kvm",
        "--run",
        str(cfg.kernel),
        "--memory",
        cfg.memory,
        "--cpus",
        str(cfg.cpus),
        "--rwdir",
        str(cfg.out_dir),
        "--cwd",
        str(cfg.cwd),
        "--name",
        "nfsrdma-testbed",
        "--append",
        " ".join([KERNEL_APPEND, *cfg.extra_append]),
    ]
    if cfg.qemu_opts:
        # One "--qemu-opts=..." word: vng's parser would take a separate value that begins
        # with "-" for an option of its own.
        argv.append("--qemu-opts=" + shlex.join(cfg.qemu_opts))
    if exec_cmd is not None:
        argv += ["--exec", exec_cmd]
    elif shell is not None:
        argv += ["--shell", str(shell)]
    return argv


def vng_env() -> dict[str, str]:
    """vng runs ``virtme-run`` and friends from PATH: put the venv's bin first."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(venv_bin()), env.get("PATH", "/usr/bin:/bin")])
    return env


def guest_command(spec_path: Path) -> str:
    return shlex.join([sys.executable, "-m", "nfsrdma.testbed.guest", str(spec_path)])


def prepare_out_dir(out: Path) -> Path:
    """Create the out directory; empty it if an earlier test-bed run made it."""
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise TestbedError(f"{out} exists and is not a directory")
    if (out / OUT_MARKER).exists():
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text("results of `nfsrdma testbed`; emptied by the next run\n")
    return out


def write_spec(out: Path, spec: GuestSpec) -> Path:
    path = out / SPEC_FILE
    path.write_text(spec.to_json() + "\n")
    return path


def write_shell_script(out: Path, spec_path: Path) -> Path:
    path = out / SHELL_SCRIPT
    path.write_text(f"#!/bin/sh\nexec {guest_command(spec_path)}\n")
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------------------------------------
# Running


@dataclass(slots=True)
class VmResult:
    exit_code: int
    timed_out: bool
    wall_s: float
    first_output_s: float | None


class _Relay:
    """Copies one guest stream to a host stream and to the console log, as it arrives."""

    def __init__(self, src: IO[bytes], dst: BinaryIO, log: BinaryIO | None, lock: threading.Lock):
        self.src, self.dst, self.log, self.lock = src, dst, log, lock
        self.banner_at: float | None = None
        self.thread = threading.Thread(target=self._pump, daemon=True)

    def _pump(self) -> None:
        fd = self.src.fileno()
        while chunk := os.read(fd, 65536):
            if self.banner_at is None and BANNER in chunk:
                self.banner_at = time.monotonic()
            with self.lock:
                with contextlib.suppress(OSError, ValueError):
                    self.dst.write(chunk)
                    self.dst.flush()
                if self.log is not None:
                    self.log.write(chunk)
                    self.log.flush()


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _shell_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_vm(argv: Sequence[str], *, timeout_s: float | None, console_log: Path | None) -> VmResult:
    """Boot non-interactively. Guest stdout/stderr go to ours through pipes (never let qemu
    open our stdout itself: it truncates a redirected log file)."""
    t0 = time.monotonic()
    lock = threading.Lock()
    log = open(console_log, "wb") if console_log is not None else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=vng_env(),
            start_new_session=True,  # so a timeout can take down vng and qemu together
        )
        assert proc.stdout is not None and proc.stderr is not None
        relays = [
            _Relay(proc.stdout, sys.stdout.buffer, log, lock),
            _Relay(proc.stderr, sys.stderr.buffer, log, lock),
        ]
        for r in relays:
            r.thread.start()
        timed_out = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        for r in relays:
            r.thread.join(timeout=10)
        firsts = [r.banner_at for r in relays if r.banner_at is not None]
        first = min(firsts) - t0 if firsts else None
        code = EXIT_TIMEOUT if timed_out else _shell_code(proc.returncode)
        return VmResult(code, timed_out, time.monotonic() - t0, first)
    finally:
        if log is not None:
            log.close()


def run_vm_interactive(argv: Sequence[str]) -> int:
    """Boot with the terminal attached (vng restores the terminal settings itself)."""
    return _shell_code(subprocess.call(list(argv), env=vng_env()))


# ---------------------------------------------------------------------------------------------
# The whole thing


# qemu options that could give the guest a network (the test bed has none): refused.
_REFUSED_OPTS = frozenset({"-net", "-netdev", "-nic", "-device"})


def parse_qemu_opts(text: str) -> tuple[str, ...]:
    """Extra qemu options for experiments with the emulator (``-accel tcg,tb-size=2048``,
    ``-cpu qemu64``); later options override vng's own. Options that add devices or a
    network are refused."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise TestbedError(f"--qemu-opts: {exc}") from None
    for w in words:
        if w.split("=", 1)[0].replace("--", "-", 1) in _REFUSED_OPTS:
            raise TestbedError(f"--qemu-opts: {w} could give the guest a network; refused")
    return words


def parse_append(text: str) -> tuple[str, ...]:
    """Extra words for the guest kernel's command line (``pti=off``), after the test bed's
    own. ``init=`` and ``rdinit=`` are refused: virtme-ng's init is what starts the guest session."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise TestbedError(f"--append: {exc}") from None
    for w in words:
        if w.split("=", 1)[0] in ("init", "rdinit"):
            raise TestbedError(f"--append: {w} would replace the test bed's init; refused")
    return words


def resolve(
    out_dir: Path,
    *,
    kernel: Path | None,
    memory: str,
    cpus: int,
    timeout_s: float | None,
    qemu_opts: tuple[str, ...] = (),
    extra_append: tuple[str, ...] = (),
) -> VmConfig:
    k = kernel or find_kernel()
    if k is None or not k.exists():
        raise TestbedError(
            "no readable kernel image (/boot/vmlinuz-*); run `nfsrdma testbed check`"
        )
    vng = find_vng()
    if vng is None:
        raise TestbedError("vng (virtme-ng) not found; run `nfsrdma testbed check`")
    if shutil.which("qemu-system-x86_64") is None:
        raise TestbedError("qemu-system-x86_64 not found; run `nfsrdma testbed check`")
    return VmConfig(
        kernel=k,
        vng=vng,
        out_dir=prepare_out_dir(out_dir),
        cwd=checkout_dir(),
        memory=memory,
        cpus=cpus,
        timeout_s=timeout_s,
        qemu_opts=qemu_opts,
        extra_append=extra_append,
    )


def run_command(cfg: VmConfig, command: Sequence[str], *, knfsd: bool) -> int:
    """Boot, set up, run ``command`` as root in the checkout, return its exit code."""
    spec = GuestSpec(
        out_dir=str(cfg.out_dir),
        cwd=str(cfg.cwd),
        knfsd=knfsd,
        command=tuple(command),
        path_prepend=(str(venv_bin()),),
    )
    spec_path = write_spec(cfg.out_dir, spec)
    argv = vng_argv(cfg, exec_cmd=guest_command(spec_path))
    result = run_vm(argv, timeout_s=cfg.timeout_s, console_log=cfg.out_dir / CONSOLE_LOG)
    _report(cfg, result)
    return result.exit_code


def run_shell(cfg: VmConfig, *, knfsd: bool) -> int:
    spec = GuestSpec(
        out_dir=str(cfg.out_dir),
        cwd=str(cfg.cwd),
        knfsd=knfsd,
        shell=True,
        path_prepend=(str(venv_bin()),),
    )
    script = write_shell_script(cfg.out_dir, write_spec(cfg.out_dir, spec))
    return run_vm_interactive(vng_argv(cfg, shell=script))


def _report(cfg: VmConfig, result: VmResult) -> None:
    try:
        t: dict[str, object] = json.loads((cfg.out_dir / TIMINGS_FILE).read_text())
    except (OSError, ValueError):
        t = {}
    parts = [f"exit {result.exit_code}", f"wall {result.wall_s:.1f} s"]
    if result.first_output_s is not None:
        parts.append(f"boot {result.first_output_s:.1f} s")
    if "knfsd_ready_s" in t:
        parts.append(f"knfsd ready {t['knfsd_ready_s']} s")
    elif "rxe_s" in t:
        parts.append(f"rxe {t['rxe_s']} s")
    if "command_s" in t:
        parts.append(f"command {t['command_s']} s")
    host = {
        "host_wall_s": round(result.wall_s, 2),
        "host_boot_s": None if result.first_output_s is None else round(result.first_output_s, 2),
        "host_exit_code": result.exit_code,
        "timed_out": result.timed_out,
    }
    with contextlib.suppress(OSError):
        (cfg.out_dir / TIMINGS_FILE).write_text(
            json.dumps({**t, **host}, indent=2, sort_keys=True) + "\n"
        )
    if result.timed_out:
        print(
            f"testbed: TIMEOUT after {cfg.timeout_s:.0f} s; guest killed "
            f"(kernel log: {cfg.out_dir / KERNEL_LOG})",
            file=sys.stderr,
        )
    elif result.exit_code == 255 and "exit_code" not in t:
        print(
            "testbed: the guest ended without a command exit status (kernel panic?); "
            f"see {cfg.out_dir / KERNEL_LOG}",
            file=sys.stderr,
        )
    print(f"testbed: {', '.join(parts)}; results in {cfg.out_dir}", file=sys.stderr, flush=True)
