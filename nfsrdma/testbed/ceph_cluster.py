"""A throwaway single-node Ceph cluster with one CephFS, for tests and benchmarks.

One monitor, one manager (it reports the space figures that statfs gives), one BlueStore OSD
on a sparse file, one MDS, pools of size 1, everything bound to 127.0.0.1 and kept in one directory: configuration,
keyrings, data, logs, pid files and admin sockets. The daemons are Debian's Ceph packages
(``ceph-mon ceph-osd ceph-mds ceph-common``), started by hand: no systemd, containers or kernel
modules. ``start()`` returns when a libcephfs client can mount the file system; it raises
:class:`CephClusterError` with the daemon's log tail when something does not come up.

Facts this relies on (each one cost a failed start when ignored):
- the client keyring goes in ``[client]`` only: in ``[global]`` it would override the daemons';
- BlueStore makes its block file itself when ``bluestore block path`` is left unset;
- ``ceph-osd --mkfs --key`` writes no keyring file, so it is written here;
- both CephFS pools get 16 placement groups with the autoscaler off (``fs new`` asks for 16);
- an active MDS may ignore SIGTERM: the file system is failed first (``ceph fs fail``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph", "ceph-authtool", "monmaptool")
APT_PACKAGES = ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph-common", "libcephfs2")


class CephClusterError(RuntimeError):
    pass


def _free_port_pair() -> int:
    """A port p such that p and p + 1 are free on 127.0.0.1 (messenger v2 and v1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise CephClusterError("no free pair of ports on 127.0.0.1")


@dataclass
class CephCluster:
    """A cluster living in ``directory``; ``conf`` is the ceph.conf clients read."""

    directory: Path
    fs_name: str = "cephfs"
    osd_size: str = "4G"
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.directory / "ceph.conf"

    # ------------------------------------------------------------------ helpers
    def ceph(self, *args: str, timeout: float = 60) -> str:
        cmd = ["ceph", "-c", str(self.conf), "--connect-timeout", "30", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise CephClusterError(f"{' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def _log_tail(self, name: str) -> str:
        out = []
        for suffix in (".out", ".log"):
            p = self.directory / "log" / f"{name}{suffix}"
            with contextlib.suppress(OSError):
                out.append(p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def _daemon(self, name: str, *argv: str) -> None:
        """Start a daemon (it forks; the parent returns once the daemon has initialised) and
        note its process id from the pid file the daemon writes. A daemon killed by
        ``kill_daemon`` leaves its pid file behind: it is removed first, so that the id noted
        is the new daemon's (else ``stop`` would signal the dead one and leave the new one
        running)."""
        pidfile = self.directory / "run" / f"{name}.pid"
        pidfile.unlink(missing_ok=True)
        with open(self.directory / "log" / f"{name}.out", "ab") as log:
            r = subprocess.run(
                [*argv, "-c", str(self.conf)], stdout=log, stderr=log, timeout=120, check=False
            )
        if r.returncode != 0:
            raise CephClusterError(f"{name} did not start:\n{self._log_tail(name)}")
        self._wait(f"{name}'s pid file", lambda: self._note_pid(name, pidfile), 30)

    def _note_pid(self, name: str, pidfile: Path) -> bool:
        try:
            self.pids[name] = int(pidfile.read_text())
        except (OSError, ValueError):  # not written yet, or written in part
            return False
        return True

    def _wait(self, what: str, probe: object, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if callable(probe) and probe():
                    return
            except (CephClusterError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                raise CephClusterError(f"timed out after {seconds:.0f} s waiting for {what}")
            time.sleep(0.25)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        missing = [b for b in DAEMONS if shutil.which(b) is None]
        if missing:
            raise CephClusterError(
                f"missing {', '.join(missing)} (apt-get install {' '.join(APT_PACKAGES)})"
            )
        d = self.directory
        for sub in ("run", "log", "crash", "mon.a", "mgr.x", "osd.0", "mds.a"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._configure()
            self._start_mon()
            self._start_mgr()
            self._start_osd()
            self._start_mds()
            self._wait("the space figures", self._space_reported, 60)
        except BaseException:
            self.stop()
            raise

    def _configure(self) -> None:
        d = self.directory
        port = _free_port_pair()
        fsid = str(uuid.uuid4())
        self.mon_addrs = f"[v2:127.0.0.1:{port},v1:127.0.0.1:{port + 1}]"
        self.fsid = fsid
        self.conf.write_text(
            f"""[global]
fsid = {fsid}
mon host = {self.mon_addrs}
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = {port + 2}
ms bind port max = {port + 200}
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
crash dir = {d}/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon data avail warn = 2
mon data avail crit = 1

[client]
keyring = {d}/keyring

[mon]
mon data = {d}/mon.$id

[mgr]
mgr data = {d}/mgr.$id

[osd]
osd data = {d}/osd.$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = {self.osd_size}
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mkfs = false
osd memory target = 939524096
osd op num shards = 2
bdev aio poll ms = 20

[mds]
mds data = {d}/mds.$id
"""
        )

    def _start_mon(self) -> None:
        d = self.directory
        keyring = str(d / "keyring")
        run = subprocess.run
        run(["ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.",
             "--cap", "mon", "allow *"], check=True, capture_output=True)  # fmt: skip
        run(["ceph-authtool", keyring, "--gen-key", "-n", "client.admin",
             "--cap", "mon", "allow *", "--cap", "osd", "allow *",
             "--cap", "mds", "allow *", "--cap", "mgr", "allow *"],
            check=True, capture_output=True)  # fmt: skip
        run(["monmaptool", "--create", "--clobber", "--fsid", self.fsid,
             "--addv", "a", self.mon_addrs, str(d / "monmap")],
            check=True, capture_output=True)  # fmt: skip
        run(["ceph-mon", "-c", str(self.conf), "-i", "a", "--mkfs",
             "--monmap", str(d / "monmap"), "--keyring", keyring],
            check=True, capture_output=True)  # fmt: skip
        self._daemon("mon.a", "ceph-mon", "-i", "a")
        self._wait("the monitor's quorum", lambda: bool(self.ceph("mon", "stat")), 30)

    def _start_mgr(self) -> None:
        keyring = str(self.directory / "mgr.x" / "keyring")
        self.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr",
                  "mds", "allow *", "osd", "allow *", "-o", keyring)  # fmt: skip
        self._daemon("mgr.x", "ceph-mgr", "-i", "x")

    def _space_reported(self) -> bool:
        """True once the manager reports the OSD's capacity (what statfs returns)."""
        df = json.loads(self.ceph("df", "-f", "json"))
        return int(df.get("stats", {}).get("total_bytes", 0)) > 0

    def _start_osd(self) -> None:
        d = self.directory
        osd_uuid = str(uuid.uuid4())
        key = subprocess.run(
            ["ceph-authtool", "--gen-print-key"], check=True, capture_output=True, text=True
        ).stdout.strip()
        secret = d / "osd.0" / "new.json"
        secret.write_text(json.dumps({"cephx_secret": key}))
        osd_id = self.ceph("osd", "new", osd_uuid, "-i", str(secret)).strip()
        secret.unlink()
        if osd_id != "0":
            raise CephClusterError(f"expected OSD id 0, got {osd_id!r}")
        with open(d / "log" / "osd.0.mkfs.log", "wb") as log:
            r = subprocess.run(
                ["ceph-osd", "-c", str(self.conf), "-i", "0", "--mkfs", "--key", key,
                 "--osd-uuid", osd_uuid],
                stdout=log, stderr=log, timeout=120, check=False,
            )  # fmt: skip
        if r.returncode != 0:
            raise CephClusterError(f"OSD mkfs failed:\n{self._log_tail('osd.0.mkfs')}")
        (d / "osd.0" / "keyring").write_text(f"[osd.0]\n\tkey = {key}\n")
        self._daemon("osd.0", "ceph-osd", "-i", "0")
        # CephFS pools and the file system need only the monitor: done while the OSD boots.
        self.ceph("osd", "pool", "create", "cephfs_metadata", "16", "16")
        self.ceph("osd", "pool", "create", "cephfs_data", "16", "16")
        self.ceph("fs", "new", self.fs_name, "cephfs_metadata", "cephfs_data")
        self.ceph("auth", "get-or-create", "mds.a", "mon", "allow profile mds",
                  "osd", "allow rw tag cephfs *=*", "mds", "allow",
                  "-o", str(d / "mds.a" / "keyring"))  # fmt: skip
        self._wait("osd.0 up", lambda: " 1 up" in self.ceph("osd", "stat"), 90)

    def _start_mds(self) -> None:
        self._daemon("mds.a", "ceph-mds", "-i", "a")
        self._wait("an active MDS", lambda: "up:active" in self.ceph("mds", "stat"), 90)

    def stop(self) -> None:
        """Stop every daemon (failing the file system first so that the MDS exits)."""
        if "mds.a" in self.pids:
            with contextlib.suppress(Exception):
                self.ceph("fs", "fail", self.fs_name, timeout=20)
        for name in ("mds.a", "osd.0", "mgr.x", "mon.a"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _terminate(pid)
        # An MDS told that its file system failed may respawn (re-executing itself, and
        # daemonising again under a new process id) while it is being stopped: what is left
        # of this cluster's daemons is found by the configuration file they were started with.
        for _ in range(3):
            left = self._leftovers()
            if not left:
                return
            for pid in left:
                _terminate(pid)
        raise CephClusterError(f"daemons still running after stop: {self._leftovers()}")

    def _leftovers(self) -> list[int]:
        """The processes running with this cluster's configuration file (``-c`` path)."""
        conf = os.fsencode(self.conf)
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            if conf in argv and os.path.basename(argv[0]).startswith(b"ceph-"):
                found.append(int(entry))
        return found

    def kill_daemon(self, name: str) -> None:
        """Stop one daemon (``osd.0``, ``mds.a``) abruptly, to test outages."""
        pid = self.pids.pop(name)
        _terminate(pid, signal.SIGKILL)

    def restart_daemon(self, name: str) -> None:
        """Start a daemon stopped by ``kill_daemon`` again (an MDS: until it is active)."""
        kind, ident = name.split(".")
        self._daemon(name, f"ceph-{kind}", "-i", ident)
        if kind == "mds":
            self._wait("an active MDS", lambda: "up:active" in self.ceph("mds", "stat"), 120)


def _terminate(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
