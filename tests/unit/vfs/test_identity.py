"""AUTH_SYS identity on every access: the kernel checks permissions as the (squashed) caller."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nfsrdma.vfs import (
    ACCESS4_DELETE,
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    Cred,
    Export,
    FileType,
    LocalVfs,
    confine,
    identity,
)
from nfsrdma.vfs.identity import (
    FsIdentity,
    handoffs,
    is_protected,
    protect_current_thread,
    squash,
)

from .conftest import ROOT, U1000, U1001, MakeVfs, needs_root

pytestmark = needs_root


def _file(path: Path, data: bytes, mode: int, uid: int, gid: int) -> None:
    path.write_bytes(data)
    os.chown(path, uid, gid)
    path.chmod(mode)


def test_squash_maps_root_and_group_zero() -> None:
    e = Export("/x")
    assert squash(e, Cred(0, 0, (0, 5))) == Cred(65534, 65534, (65534, 5))
    assert squash(e, Cred(1000, 0, ())) == Cred(1000, 65534, ())
    assert squash(e, U1000) == U1000
    assert squash(Export("/x", anon_uid=7, anon_gid=8), ROOT) == Cred(7, 8, ())
    assert squash(Export("/x", root_squash=False), ROOT) == ROOT


def test_owner_only_file(make_vfs: MakeVfs, export_dir: Path) -> None:
    _file(export_dir / "mine", b"data", 0o600, 1000, 1000)
    vfs = make_vfs()
    fh = vfs.lookup(U1001, vfs.root_handle(), b"mine")
    with pytest.raises(PermissionError):
        vfs.open(U1001, fh, read=True, write=False)
    with pytest.raises(PermissionError):
        vfs.anonymous_read(U1001, fh, 0, 10)
    assert vfs.access(U1001, fh, ACCESS4_READ | ACCESS4_MODIFY) == 0
    assert vfs.anonymous_read(U1000, fh, 0, 10) == (b"data", True)
    assert vfs.access(U1000, fh, ACCESS4_READ | ACCESS4_MODIFY) == ACCESS4_READ | ACCESS4_MODIFY


def test_root_squash_denies_root_on_a_0600_root_file(make_vfs: MakeVfs, export_dir: Path) -> None:
    _file(export_dir / "rootonly", b"top secret", 0o600, 0, 0)
    squashed = make_vfs()
    fh = squashed.lookup(ROOT, squashed.root_handle(), b"rootonly")
    with pytest.raises(PermissionError):
        squashed.open(ROOT, fh, read=True, write=False)
    assert squashed.access(ROOT, fh, ACCESS4_READ) == 0
    # root squashed cannot chown either (no CAP_CHOWN), nor create devices.
    with pytest.raises(PermissionError):
        squashed.setattr(ROOT, fh, uid=1000)
    with pytest.raises(PermissionError):
        squashed.create(ROOT, squashed.root_handle(), b"null", FileType.NF4CHR, 0o666, rdev=(1, 3))
    trusted = make_vfs(root_squash=False)
    assert trusted.anonymous_read(ROOT, fh, 0, 100) == (b"top secret", True)
    assert trusted.setattr(ROOT, fh, uid=1000).uid == 1000


def test_anon_uid_option_owns_files_created_by_root(make_vfs: MakeVfs, export_dir: Path) -> None:
    export_dir.chmod(0o777)
    vfs = make_vfs(anon_uid=4321, anon_gid=4322)
    _, of, _ = vfs.create_file(ROOT, vfs.root_handle(), b"byroot", 0o644)
    of.close()
    vfs.release_identity()  # before the test itself touches files
    st = (export_dir / "byroot").stat()
    assert (st.st_uid, st.st_gid) == (4321, 4322)


def test_created_objects_belong_to_the_caller(make_vfs: MakeVfs, export_dir: Path) -> None:
    export_dir.chmod(0o777)
    vfs = make_vfs()
    root = vfs.root_handle()
    _, of, _ = vfs.create_file(U1000, root, b"f", 0o640)
    of.close()
    vfs.create(Cred(1001, 1001, (50,)), root, b"d", FileType.NF4DIR, 0o750)
    vfs.release_identity()
    f, d = (export_dir / "f").stat(), (export_dir / "d").stat()
    assert (f.st_uid, f.st_gid, f.st_mode & 0o777) == (1000, 1000, 0o640)
    assert (d.st_uid, d.st_gid, d.st_mode & 0o777) == (1001, 1001, 0o750)


def test_supplementary_groups_grant_access(make_vfs: MakeVfs, export_dir: Path) -> None:
    _file(export_dir / "g", b"group", 0o040, 0, 777)
    vfs = make_vfs()
    fh = vfs.lookup(U1000, vfs.root_handle(), b"g")
    with pytest.raises(PermissionError):
        vfs.anonymous_read(U1000, fh, 0, 10)
    assert vfs.anonymous_read(Cred(1000, 1000, (5, 777)), fh, 0, 10) == (b"group", True)
    assert vfs.anonymous_read(Cred(1000, 777, ()), fh, 0, 10) == (b"group", True)


def test_directory_permissions_apply_to_lookup_create_remove(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    (export_dir / "priv").mkdir(mode=0o700)
    os.chown(export_dir / "priv", 1000, 1000)
    (export_dir / "priv" / "x").write_bytes(b"")
    (export_dir / "ro").mkdir(mode=0o755)
    os.chown(export_dir / "ro", 1000, 1000)
    (export_dir / "ro" / "y").write_bytes(b"")
    vfs = make_vfs()
    root = vfs.root_handle()
    priv = vfs.lookup(U1001, root, b"priv")
    with pytest.raises(PermissionError):
        vfs.lookup(U1001, priv, b"x")
    assert vfs.lookup(U1000, priv, b"x")
    ro = vfs.lookup(U1001, root, b"ro")
    with pytest.raises(PermissionError):
        vfs.create_file(U1001, ro, b"new", 0o644)
    with pytest.raises(PermissionError):
        vfs.remove(U1001, ro, b"y")
    with pytest.raises(PermissionError):
        vfs.rename(U1001, ro, b"y", ro, b"z")
    assert vfs.access(U1001, ro, 0x3F) == ACCESS4_READ | ACCESS4_LOOKUP
    full = ACCESS4_READ | ACCESS4_LOOKUP | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE
    assert vfs.access(U1000, ro, 0x3F) == full
    vfs.remove(U1000, ro, b"y")


def test_access_bits_per_type(vfs: LocalVfs, export_dir: Path) -> None:
    _file(export_dir / "prog", b"#!/bin/sh\n", 0o751, 1000, 1000)
    root = vfs.root_handle()
    fh = vfs.lookup(U1001, root, b"prog")
    assert vfs.access(U1001, fh, 0x3F) == ACCESS4_EXECUTE
    assert vfs.access(U1000, fh, 0x3F) == (
        ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_EXECUTE
    )
    assert vfs.access(U1000, fh, ACCESS4_READ) == ACCESS4_READ  # only what was asked


def test_read_if_exec_lets_clients_execute(make_vfs: MakeVfs, export_dir: Path) -> None:
    """knfsd NFSD_MAY_READ_IF_EXEC: a 0711 program may be READ by whoever may execute it."""
    _file(export_dir / "prog", b"\x7fELF", 0o711, 1000, 1000)
    _file(export_dir / "noexec", b"no", 0o700, 1000, 1000)
    vfs = make_vfs()
    root = vfs.root_handle()
    prog = vfs.lookup(U1001, root, b"prog")
    assert vfs.anonymous_read(U1001, prog, 0, 4) == (b"\x7fELF", True)
    with pytest.raises(PermissionError):
        vfs.open(U1001, prog, read=True, write=True)
    with pytest.raises(PermissionError):
        vfs.anonymous_read(U1001, vfs.lookup(U1001, root, b"noexec"), 0, 4)


def test_owner_writes_through_its_create_even_if_mode_is_read_only(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    """RFC 8881 §18.16: open-with-create returns a writable open whatever the new mode."""
    export_dir.chmod(0o777)
    vfs = make_vfs()
    fh, of, created = vfs.create_file(U1000, vfs.root_handle(), b"ro", 0o444)
    assert created and of.writable
    assert of.write(0, b"written") == 7
    of.close()
    vfs.release_identity()
    assert (export_dir / "ro").read_bytes() == b"written"
    assert (export_dir / "ro").stat().st_mode & 0o777 == 0o444
    # A later plain OPEN for writing is refused, but the owner may still truncate.
    with pytest.raises(PermissionError):
        vfs.open(U1000, fh, read=False, write=True)
    assert vfs.setattr(U1000, fh, size=3).size == 3
    with pytest.raises(PermissionError):
        vfs.setattr(U1001, fh, size=0)


def test_identity_is_per_thread(make_vfs: MakeVfs, export_dir: Path) -> None:
    """Two threads acting for different users at once never see each other's rights."""
    _file(export_dir / "a", b"A" * 100, 0o600, 1000, 1000)
    _file(export_dir / "b", b"B" * 100, 0o600, 1001, 1001)
    vfs = make_vfs()
    root = vfs.root_handle()
    fa, fb = vfs.lookup(U1000, root, b"a"), vfs.lookup(U1001, root, b"b")
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def worker(cred: Cred, mine: bytes, theirs: bytes) -> None:
        try:
            barrier.wait()
            for _ in range(300):
                if vfs.anonymous_read(cred, mine, 0, 1)[0] not in (b"A", b"B"):
                    errors.append("bad data")
                try:
                    vfs.anonymous_read(cred, theirs, 0, 1)
                    errors.append(f"uid {cred.uid} read the other file")
                except PermissionError:
                    pass
        except Exception as e:
            errors.append(repr(e))
        finally:
            vfs.release_identity()

    threads = [
        threading.Thread(target=worker, args=(U1000, fa, fb)),
        threading.Thread(target=worker, args=(U1001, fb, fa)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_new_threads_do_not_inherit_a_stale_cache(make_vfs: MakeVfs, export_dir: Path) -> None:
    """A thread spawned while its creator acts as uid 1000 inherits fsuid 1000 from the kernel;
    the VFS must still apply the right identity in it."""
    _file(export_dir / "r", b"root", 0o600, 0, 0)
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    fh = vfs.lookup(ROOT, root, b"r")
    with pytest.raises(PermissionError):
        vfs.anonymous_read(U1000, fh, 0, 4)  # this thread now has fsuid 1000
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(vfs.anonymous_read(ROOT, fh, 0, 4)))
    t.start()
    t.join()
    assert out == [(b"root", True)]


def _in_new_thread(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a thread of its own (not protected, never switched before)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(fn).result()


def test_release_identity_restores_the_server(make_vfs: MakeVfs, tmp_path: Path) -> None:
    vfs = make_vfs()
    private = tmp_path / "private"
    private.write_bytes(b"x")
    private.chmod(0o600)

    def scenario() -> None:
        vfs.access(U1000, vfs.root_handle(), ACCESS4_READ)
        with pytest.raises(PermissionError):
            private.read_bytes()  # this thread acts as uid 1000 now
        vfs.release_identity()
        assert private.read_bytes() == b"x"

    _in_new_thread(scenario)


@needs_root
def test_a_protected_thread_keeps_its_credentials(make_vfs: MakeVfs, tmp_path: Path) -> None:
    """The thread that drives RDMA never changes identity (the kernel would refuse its RDMA
    commands): a VFS call as another user runs in the identity worker, with that user's
    permissions, and the thread's own fs uid and groups stay the server's."""
    vfs = make_vfs(root_squash=False)
    fh = vfs.create(ROOT, vfs.root_handle(), "secret", FileType.NF4DIR, 0o700)

    def scenario() -> None:
        protect_current_thread()
        before = _thread_creds()
        with pytest.raises(PermissionError):
            vfs.lookup(U1000, fh, "x")  # uid 1000 may not search root's 0700 directory
        assert vfs.access(U1000, fh, ACCESS4_READ) == 0
        assert _thread_creds() == before
        with pytest.raises(FileNotFoundError):
            vfs.lookup(ROOT, fh, "x")  # root may search it

    _in_new_thread(scenario)


def test_the_protected_mark_belongs_to_its_thread() -> None:
    """``protect_current_thread`` marks the calling thread only: neither the thread that
    started it nor a thread it starts is marked. (The per-thread state is a
    ``threading.local`` subclass with class defaults; compiled by mypyc it would be one state
    for every thread, which is why setup.py leaves vfs/identity.py out of the compiled build.)"""
    seen: dict[str, bool] = {}

    def started_by_the_marked() -> None:
        seen["started by it"] = is_protected()

    def marked() -> None:
        protect_current_thread()
        seen["marked"] = is_protected()
        _in_new_thread(started_by_the_marked)

    def starter() -> None:
        _in_new_thread(marked)
        seen["its starter"] = is_protected()

    _in_new_thread(starter)
    assert seen == {"marked": True, "started by it": False, "its starter": False}


@needs_root
def test_a_protected_thread_creates_as_each_caller_in_turn(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    """Calls for different identities on a protected thread, alternating: each object belongs
    to its own caller (no call runs with the identity the previous one left behind), each
    call for an identity other than the server's is handed off exactly once, and the
    server's own calls are not handed off."""
    export_dir.chmod(0o777)
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    callers = [U1000, ROOT, U1001, U1001, ROOT, U1000]
    counted: list[int] = []

    def scenario() -> None:
        protect_current_thread()
        before = _thread_creds()
        for i, who in enumerate(callers):
            start = handoffs()
            _, of, _ = vfs.create_file(who, root, b"f%d" % i, 0o644)
            of.close()
            if i % 2:
                vfs.remove(who, root, b"f%d" % i)
            counted.append(handoffs() - start)
        assert _thread_creds() == before

    _in_new_thread(scenario)
    for i, who in enumerate(callers):
        if i % 2 == 0:
            st = (export_dir / f"f{i}").stat()
            assert (st.st_uid, st.st_gid) == (who.uid, who.gid)
        else:
            assert not (export_dir / f"f{i}").exists()
    calls = [1 if i % 2 == 0 else 2 for i in range(len(callers))]
    server = vfs._ident.server
    assert counted == [0 if who == server else n for who, n in zip(callers, calls, strict=True)]


@needs_root
def test_a_handed_off_call_works_in_the_callers_check_window(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    """The caller waits while its call runs in the identity worker: what the call found
    inside the export (a LOOKUP's object) counts in the caller's check window, and the worker
    keeps no window once the call is over."""
    (export_dir / "f").write_bytes(b"x")
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    seen: list[bool] = []

    def worker_window() -> object:
        return confine.window()

    def scenario() -> None:
        protect_current_thread()
        confine.open_window()
        try:
            fh = vfs.lookup(U1000, root, b"f")
            checked = confine.window()
            assert checked is not None
            seen.append(any(h == fh for _, h in checked))
        finally:
            confine.close_window()

    _in_new_thread(scenario)
    assert seen == [True]
    assert identity._in_identity_worker(worker_window) is None


def _thread_creds() -> list[str]:
    """The Uid, Gid and Groups lines of the calling thread (fs ids included)."""
    with open("/proc/thread-self/status") as f:
        return [line for line in f if line.startswith(("Uid:", "Gid:", "Groups:"))]


def test_identity_switch_fails_closed_without_privilege() -> None:
    if os.geteuid() == 0:
        ident = FsIdentity()
        assert ident.enabled
        ident.apply(U1000)
        ident.apply_server()
    with pytest.raises(OSError) as ei:
        LocalVfs(Export("/nonexistent-export-dir"))
    assert ei.value.errno == errno.ENOENT
