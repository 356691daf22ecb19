"""The workload the Linux NFS client runs against a server (issue 4 and 5 acceptance).

``run_workload(mountpoint)`` does, through the kernel client: a tree of 200 files and
directories; files from 0 B to 8 MiB written and read back after dropping caches (checksums);
rename, hard link, symlink, chmod, truncate; 4 concurrent writers on distinct files and 2 on one
file under byte-range locks (fcntl) and whole-file locks (flock), with a lock conflict between
them checked; ``ls -lR``; ``rm -r``. It returns a ``Result`` that does not depend on the server
(no inode numbers or times), so the results of two servers can be compared for equality.
"""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing as mp
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nfsrdma.testbed.helpers import drop_caches

SIZES = (0, 1, 4095, 4096, 4097, 65536, (1 << 20) + 3, 8 << 20)
# 2 directories + 198 files = 200 objects. 99 entries a directory is more than our server lists
# on its event loop (ServerConfig.readdir_inline, 64): the Linux client's READDIRs of them go on
# in the server's thread pool.
TREE_DIRS = 2
TREE_FILES_PER_DIR = 99
RECORD = 512
RECORDS_PER_LOCKER = 40


def pattern(seed: str, size: int) -> bytes:
    """Deterministic, incompressible-looking content."""
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64  # 2 KiB per hash: fast enough under emulation
    return bytes(out[:size])


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Result:
    listing: list[str] = field(default_factory=list)  # normalized ls -lR
    checksums: dict[str, str] = field(default_factory=dict)
    locked_records: dict[str, int] = field(default_factory=dict)
    lock_conflict_seen: bool = False
    flock_conflict_seen: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def comparable(self) -> tuple[list[str], dict[str, str], dict[str, int], bool, bool]:
        return (
            self.listing,
            self.checksums,
            self.locked_records,
            self.lock_conflict_seen,
            self.flock_conflict_seen,
        )


def _writer(path: str, seed: str, size: int) -> None:
    data = pattern(seed, size)
    with open(path, "wb") as f:
        for off in range(0, size, 65536):
            f.write(data[off : off + 65536])
        f.flush()
        os.fsync(f.fileno())


def _locker(path: str, who: int, use_flock: bool, ready: mp.Event, go: mp.Event) -> None:  # type: ignore[type-arg]
    """Append records under a lock; the first locker holds the lock while the other tries."""
    fd = os.open(path, os.O_RDWR)
    try:
        if who == 0:
            _lock(fd, use_flock, blocking=True)
            ready.set()
            go.wait(60)
            _unlock(fd, use_flock)
        for i in range(RECORDS_PER_LOCKER):
            _lock(fd, use_flock, blocking=True)
            end = os.lseek(fd, 0, os.SEEK_END)
            rec = f"{who}:{i:04d}:".encode().ljust(RECORD - 1, b"." if who else b"-") + b"\n"
            os.pwrite(fd, rec, end)
            os.fsync(fd)
            _unlock(fd, use_flock)
    finally:
        os.close(fd)


def _lock(fd: int, use_flock: bool, blocking: bool) -> None:
    flags = 0 if blocking else (fcntl.LOCK_NB)
    if use_flock:
        fcntl.flock(fd, fcntl.LOCK_EX | flags)
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX | flags, 0, 0)


def _unlock(fd: int, use_flock: bool) -> None:
    if use_flock:
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0)


def _try_lock_elsewhere(path: str, use_flock: bool, q: mp.Queue) -> None:  # type: ignore[type-arg]
    fd = os.open(path, os.O_RDWR)
    try:
        _lock(fd, use_flock, blocking=False)
    except OSError:
        q.put(True)  # conflict seen: the other process holds the lock
    else:
        _unlock(fd, use_flock)
        q.put(False)
    finally:
        os.close(fd)


def _locked_writers(root: Path, name: str, use_flock: bool) -> tuple[int, bool]:
    path = root / name
    path.write_bytes(b"")
    ctx = mp.get_context("fork")
    ready, go = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=_locker, args=(str(path), who, use_flock, ready, go)) for who in (0, 1)
    ]
    procs[0].start()
    ready.wait(60)
    q: mp.Queue[bool] = ctx.Queue()  # type: ignore[type-arg]
    probe = ctx.Process(target=_try_lock_elsewhere, args=(str(path), use_flock, q))
    probe.start()
    probe.join(60)
    conflict = q.get(timeout=10)
    procs[1].start()
    go.set()
    for p in procs:
        p.join(300)
        if p.exitcode != 0:
            raise RuntimeError(f"locker exited with {p.exitcode}")
    data = path.read_bytes()
    records = [data[i : i + RECORD] for i in range(0, len(data), RECORD)]
    if any(len(r) != RECORD or not r.endswith(b"\n") for r in records):
        raise AssertionError(f"torn records in {name}")
    if len(set(records)) != len(records):
        raise AssertionError(f"a record was written twice in {name}")
    return len(records), conflict


def _listing(root: Path) -> list[str]:
    """Like ls -lR, without inode numbers and times: type, mode, links, owner, size, target."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            kind = stat.filemode(st.st_mode)
            size = "-" if stat.S_ISDIR(st.st_mode) else str(st.st_size)
            target = f" -> {os.readlink(p)}" if stat.S_ISLNK(st.st_mode) else ""
            out.append(f"{rel}/{name} {kind} {st.st_nlink} {st.st_uid}:{st.st_gid} {size}{target}")
    return out


def run_workload(mountpoint: Path, *, big: bool = True) -> Result:
    root = mountpoint / "workload"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    r = Result()
    t0 = time.monotonic()

    # A tree of 200 files and directories.
    for d in range(TREE_DIRS):
        sub = root / "tree" / f"d{d:02d}"
        sub.mkdir(parents=True)
        for f in range(TREE_FILES_PER_DIR):
            (sub / f"f{f}").write_bytes(pattern(f"tree{d}.{f}", 100 * (f % 9)))
    r.timings["tree"] = time.monotonic() - t0

    # Files from 0 B to 8 MiB, read back after dropping caches.
    t = time.monotonic()
    sizes = SIZES if big else SIZES[:-1]
    for size in sizes:
        _writer(str(root / f"size{size}"), f"size{size}", size)
    drop_caches()
    for size in sizes:
        got = sha(root / f"size{size}")
        if got != hashlib.sha256(pattern(f"size{size}", size)).hexdigest():
            raise AssertionError(f"size{size}: content differs after reading back")
        r.checksums[f"size{size}"] = got
    r.timings["sizes"] = time.monotonic() - t

    # Rename, hard link, symlink, chmod, truncate.
    t = time.monotonic()
    (root / "size4096").rename(root / "renamed")
    os.link(root / "renamed", root / "hardlink")
    os.symlink("renamed", root / "symlink")
    os.symlink("../nowhere/at/all", root / "tree" / "dangling")
    os.chmod(root / "hardlink", 0o640)
    os.chmod(root / "tree" / "d01", 0o700)
    os.truncate(root / "size65536", 1000)
    with open(root / "size4097", "r+b") as f:
        f.truncate(10_000)  # extend with zeros
    os.mkfifo(root / "fifo")
    r.timings["namespace"] = time.monotonic() - t

    # 4 concurrent writers on distinct files.
    t = time.monotonic()
    ctx = mp.get_context("fork")
    writers = [
        ctx.Process(target=_writer, args=(str(root / f"par{i}"), f"par{i}", (1 << 20) + 7 * i))
        for i in range(4)
    ]
    for p in writers:
        p.start()
    for p in writers:
        p.join(300)
        if p.exitcode != 0:
            raise RuntimeError(f"writer exited with {p.exitcode}")
    r.timings["parallel"] = time.monotonic() - t

    # 2 writers on one file, under fcntl byte-range locks and under flock.
    t = time.monotonic()
    r.locked_records["fcntl"], r.lock_conflict_seen = _locked_writers(root, "locked", False)
    r.locked_records["flock"], r.flock_conflict_seen = _locked_writers(root, "flocked", True)
    r.timings["locks"] = time.monotonic() - t

    drop_caches()
    for name in ("renamed", "hardlink", "size65536", "size4097"):
        r.checksums[name] = sha(root / name)
    for i in range(4):
        r.checksums[f"par{i}"] = sha(root / f"par{i}")
    for d in range(TREE_DIRS):
        for f in range(TREE_FILES_PER_DIR):
            r.checksums[f"tree/d{d:02d}/f{f}"] = sha(root / "tree" / f"d{d:02d}" / f"f{f}")

    subprocess.run(["ls", "-lR", str(root)], check=True, capture_output=True, timeout=300)
    r.listing = _listing(root)

    t = time.monotonic()
    subprocess.run(["rm", "-r", str(root / "tree")], check=True, timeout=300)
    if (root / "tree").exists():
        raise AssertionError("rm -r left the tree behind")
    r.listing.append("after rm -r: " + " ".join(sorted(os.listdir(root))))
    r.timings["rm"] = time.monotonic() - t
    r.timings["total"] = time.monotonic() - t0
    return r
