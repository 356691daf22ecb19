"""``nfsrdma testbed check``: what the host lacks for the test bed, and the command that
installs it. The guest runs the host's own binaries (its root is the host's, read-only),
so every tool the guest uses must be installed on the host."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nfsrdma.testbed.vm import find_kernel, find_vng, kernel_release

# Tools used inside the guest (or to start it) → the Debian package that ships them.
TOOLS: tuple[tuple[str, str], ...] = (
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("ip", "iproute2"),
    ("rdma", "iproute2"),
    ("modprobe", "kmod"),
    ("udevadm", "udev"),
    ("busybox", "busybox-static"),
    ("rping", "rdmacm-utils"),
    ("ibv_devices", "ibverbs-utils"),
    ("ib_write_bw", "perftest"),
    ("ib_read_bw", "perftest"),
    ("rpc.nfsd", "nfs-kernel-server"),
    ("rpc.mountd", "nfs-kernel-server"),
    ("exportfs", "nfs-kernel-server"),
    ("nfsdcld", "nfs-kernel-server"),
    ("mount.nfs", "nfs-common"),
)
# Kernel modules the guest loads, from the host's /lib/modules/<release>.
MODULES = ("dummy", "rdma_rxe", "ib_uverbs", "rdma_ucm", "nfsd", "rpcrdma", "nfsv4")
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
RXE_PROVIDER_GLOB = "/usr/lib/*/libibverbs/librxe-rdmav*.so"


@dataclass(frozen=True, slots=True)
class Finding:
    what: str
    ok: bool
    detail: str
    apt: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()


def _which(tool: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which(tool, path=path)


def module_names(modules_dep: str) -> set[str]:
    """Module names (``rdma_rxe``) listed in a ``modules.dep`` text."""
    names: set[str] = set()
    for line in modules_dep.splitlines():
        path = line.split(":", 1)[0]
        base = path.rsplit("/", 1)[-1]
        name = base.split(".ko", 1)[0]
        if name:
            names.add(name.replace("-", "_"))
    return names


def run_checks() -> list[Finding]:
    found: list[Finding] = []
    kernel = find_kernel()
    if kernel is None:
        found.append(
            Finding("kernel image", False, "no readable /boot/vmlinuz-*", ("linux-image-amd64",))
        )
    else:
        found.append(Finding("kernel image", True, str(kernel)))
        dep = Path("/lib/modules") / kernel_release(kernel) / "modules.dep"
        try:
            have = module_names(dep.read_text())
        except OSError:
            have = set()
        missing = [m for m in MODULES if m not in have]
        found.append(
            Finding(
                "kernel modules",
                not missing,
                f"missing {', '.join(missing)} in {dep}" if missing else f"{len(MODULES)} found",
                ("linux-image-amd64",) if missing else (),
            )
        )
    vng = find_vng()
    found.append(
        Finding(
            "vng (virtme-ng)",
            vng is not None,
            vng or "not in the venv nor on PATH",
            pip=() if vng else ("virtme-ng>=1.30",),
        )
    )
    for tool, pkg in TOOLS:
        where = _which(tool)
        found.append(
            Finding(tool, where is not None, where or "not found", () if where else (pkg,))
        )
    providers = list(Path("/").glob(RXE_PROVIDER_GLOB.lstrip("/")))
    found.append(
        Finding(
            "libibverbs rxe provider",
            bool(providers),
            str(providers[0]) if providers else "not found",
            () if providers else ("ibverbs-providers",),
        )
    )
    return found


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def install_commands(findings: Iterable[Finding]) -> list[str]:
    findings = list(findings)
    apt = _unique(p for f in findings if not f.ok for p in f.apt)
    pip = _unique(p for f in findings if not f.ok for p in f.pip)
    cmds: list[str] = []
    if apt:
        sudo = "" if os.geteuid() == 0 else "sudo "
        cmds.append(
            f"{sudo}apt-get update && {sudo}env DEBIAN_FRONTEND=noninteractive "
            f"apt-get install -y --no-install-recommends {' '.join(apt)}"
        )
    if pip:
        cmds.append(shlex.join([sys.executable, "-m", "pip", "install", *pip]))
    return cmds


def report(findings: list[Finding]) -> tuple[str, bool]:
    width = max(len(f.what) for f in findings)
    lines = [
        f"{'ok' if f.ok else 'MISSING':7}  {f.what.ljust(width)}  {f.detail}" for f in findings
    ]
    cmds = install_commands(findings)
    if cmds:
        lines.append("")
        lines.append("To install what is missing (or run `make setup-test`, which does both):")
        lines.extend(f"  {c}" for c in cmds)
    else:
        lines.append("")
        lines.append("The test bed has everything it needs: nfsrdma testbed run -- CMD")
    return "\n".join(lines), not cmds
