"""NFS-Ganesha on the host as a third-party NFSv4.1 server over TCP (see the test-bed notes).

As root it serves a real directory with the VFS FSAL (so tests can check what the server
wrote); otherwise the in-memory MEM FSAL, run as nobody, whose files hold at most 2 MiB."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

GANESHA = shutil.which("ganesha.nfsd") or "/usr/bin/ganesha.nfsd"
PLUGINS = Path("/usr/lib/x86_64-linux-gnu/ganesha")
MEM_MAX_FILE = 2 << 20
READY = "NFS SERVER INITIALIZED"  # logged once the exports are set up


def available() -> str | None:
    """Why Ganesha cannot run here (None when it can)."""
    if not os.path.exists(GANESHA):
        return "nfs-ganesha is not installed (apt-get install nfs-ganesha nfs-ganesha-mem)"
    if not (PLUGINS / "libfsalmem.so").exists() and not (PLUGINS / "libfsalvfs.so").exists():
        return "no Ganesha FSAL installed (nfs-ganesha-mem or nfs-ganesha-vfs)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _accepts(port: int, addr: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Ganesha:
    workdir: Path
    port: int
    pseudo: str
    export_dir: Path | None  # the served directory (VFS only)
    proc: subprocess.Popen[bytes] | None = None
    bind: str = "127.0.0.1"  # the address it listens on (the test bed's, for its benchmark)

    @property
    def max_file(self) -> int:
        return 1 << 40 if self.export_dir is not None else MEM_MAX_FILE

    def url(self, port: int | None = None) -> str:
        return f"nfs://127.0.0.1:{port or self.port}{self.pseudo}"

    def start(self) -> Ganesha:
        vfs = os.geteuid() == 0 and (PLUGINS / "libfsalvfs.so").exists()
        recov = self.workdir / "recov"
        recov.mkdir(parents=True, exist_ok=True)
        if vfs:
            assert self.export_dir is not None
            self.export_dir.mkdir(parents=True, exist_ok=True)
            export = f'Path = "{self.export_dir}"; Pseudo = "{self.pseudo}"; FSAL {{ Name = VFS; }}'
            mem = ""
        else:
            self.export_dir = None
            export = f'Path = "{self.pseudo}"; Pseudo = "{self.pseudo}"; FSAL {{ Name = MEM; }}'
            mem = f"MEM {{ Inode_Size = {MEM_MAX_FILE}; }}"
            os.chmod(self.workdir, 0o777)
            os.chmod(recov, 0o777)
        conf = self.workdir / "ganesha.conf"
        conf.write_text(
            f"""
NFS_CORE_PARAM {{ NFS_Port = {self.port}; Bind_addr = {self.bind}; Protocols = 4;
  Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
  Plugins_Dir = "{PLUGINS}"; }}
NFSV4 {{ Minor_Versions = 1; Graceless = true; Lease_Lifetime = 10;
  RecoveryBackend = fs; RecoveryRoot = "{recov}"; Only_Numeric_Owners = true; }}
EXPORT {{ Export_Id = 1; {export} Access_Type = RW; Squash = No_Root_Squash;
  Protocols = 4; Transports = TCP; SecType = sys; }}
{mem}
"""
        )
        argv = [
            GANESHA,
            "-F",
            "-f",
            str(conf),
            "-L",
            str(self.workdir / "ganesha.log"),
            "-p",
            str(self.workdir / "ganesha.pid"),
        ]
        if not vfs and os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        log = self.workdir / "ganesha.log"
        seen = log.stat().st_size if log.exists() else 0  # a restart appends to the same log
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        # Ready means: Ganesha says it finished initialising (exports included, which it sets
        # up after it starts listening) and the port accepts. It is a third-party process
        # with no readiness channel, so its log and its port are probed until a deadline.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ganesha exited: {self.log_tail()}")
            if READY in _read_from(log, seen) and _accepts(self.port, self.bind):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"ganesha did not become ready: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            lines = (self.workdir / "ganesha.log").read_text().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
