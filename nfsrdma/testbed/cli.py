"""``nfsrdma testbed run|shell|check``: the VM test bed from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nfsrdma.testbed import check, vm

DEFAULT_OUT = Path("testbed-out")


def _vm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--knfsd", action="store_true", help="start knfsd (RDMA 20049, TCP 2049)")
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help="results directory, shared with the guest as TESTBED_OUT (default: %(default)s)",
    )
    p.add_argument("--memory", default="4G", help="guest memory (default: %(default)s)")
    p.add_argument("--cpus", type=int, default=2, help="guest CPUs (default: %(default)s)")
    p.add_argument(
        "--kernel", type=Path, default=None, help="kernel image (default: newest /boot/vmlinuz-*)"
    )
    p.add_argument(
        "--qemu-opts",
        default="",
        metavar="OPTS",
        help="extra qemu options, one string, after vng's own (e.g. '-accel tcg,tb-size=2048'); "
        "no devices or network",
    )
    p.add_argument(
        "--append",
        default="",
        metavar="WORDS",
        help="extra words for the guest kernel's command line (e.g. 'pti=off')",
    )


def register(subparsers: Any) -> None:
    tb: argparse.ArgumentParser = subparsers.add_parser(
        "testbed",
        help="real Linux knfsd, NFS client and soft-RoCE in a VM",
        description="Boot Debian's kernel under qemu (virtme-ng), bring up soft-RoCE rxe0 and "
        "optionally knfsd, inside a guest that has no network to the host.",
    )
    sub = tb.add_subparsers(dest="testbed_command", required=True, metavar="SUBCOMMAND")

    run = sub.add_parser(
        "run",
        help="boot, set up, run CMD as root in the checkout, exit with its code",
        usage="nfsrdma testbed run [--knfsd] [--out DIR] [options] -- CMD...",
    )
    _vm_options(run)
    run.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="kill the guest after S seconds, exit 124 (default: %(default)s)",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    run.set_defaults(func=cmd_run)

    shell = sub.add_parser("shell", help="boot, set up, interactive root shell")
    _vm_options(shell)
    shell.set_defaults(func=cmd_shell)

    chk = sub.add_parser("check", help="say what the host lacks and how to install it")
    chk.set_defaults(func=cmd_check)


def _fail(msg: str, code: int) -> int:
    print(f"testbed: {msg}", file=sys.stderr)
    return code


def cmd_run(args: argparse.Namespace) -> int:
    command: list[str] = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return _fail("no command; usage: nfsrdma testbed run [--knfsd] [--out DIR] -- CMD...", 2)
    try:
        cfg = vm.resolve(
            args.out,
            kernel=args.kernel,
            memory=args.memory,
            cpus=args.cpus,
            timeout_s=args.timeout,
            qemu_opts=vm.parse_qemu_opts(args.qemu_opts),
            extra_append=vm.parse_append(args.append),
        )
        return vm.run_command(cfg, command, knfsd=args.knfsd)
    except vm.TestbedError as exc:
        return _fail(str(exc), vm.EXIT_MISSING)
    except KeyboardInterrupt:  # run_vm has already taken the guest down
        return _fail("interrupted; guest killed", 130)


def cmd_shell(args: argparse.Namespace) -> int:
    try:
        cfg = vm.resolve(
            args.out,
            kernel=args.kernel,
            memory=args.memory,
            cpus=args.cpus,
            timeout_s=None,
            qemu_opts=vm.parse_qemu_opts(args.qemu_opts),
            extra_append=vm.parse_append(args.append),
        )
        return vm.run_shell(cfg, knfsd=args.knfsd)
    except vm.TestbedError as exc:
        return _fail(str(exc), vm.EXIT_MISSING)


def cmd_check(args: argparse.Namespace) -> int:
    text, ok = check.report(check.run_checks())
    print(text)
    return 0 if ok else 1
