"""Create, stat, remove with fewer system calls (docs/performance.md, "Create, stat, remove"),
and the guarantees each cut keeps.

* LOOKUP and REMOVE of a name last seen as a handle whose descriptor is cached confirm the name
  with one fstatat (``Resolver.object_at_name``) instead of opening it, making its handle and
  closing it; a name that now refers to anything else (another file, a symlink, nothing, or a
  name moved out of the export) goes the usual way.
* A file created or opened by name counts as checked in the COMPOUND's window and, with the
  move watch, in later windows until something moves or is removed on the file system.
* ACCESS asks the wanted modes together, and refuses execute of a regular file that has no
  execute bit without asking (the kernel refuses it to everyone).
* A GETATTR right after ACCESS, LOOKUP or an exclusive create in one COMPOUND (and the ACCESS
  after that create) takes their fstat instead of making another (``Resolver.keep_stat``):
  only in the same check window, one resolution later, with no modification by the server
  in between.
* OPEN's open for I/O asks the type the resolver knows instead of an fstat.

These run as root (CI does): the export mount is cloned there, which the fstatat path needs.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.vfs import (
    ACCESS4_EXECUTE,
    ACCESS4_EXTEND,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    CreateMode,
    FileType,
    LocalVfs,
    StaleHandle,
    attrs,
    confine,
    syscalls,
)

from .conftest import ROOT, U1000, U1001, MakeVfs, needs_root

pytestmark = needs_root


class Calls:
    """Counts calls of some functions (the real calls still run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *targets: tuple[Any, str]) -> None:
        self.counts: dict[str, int] = {}
        for module, name in targets:
            self.counts[name] = 0
            real = getattr(module, name)

            def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                self.counts[_name] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, name, counted)

    def reset(self) -> None:
        for name in self.counts:
            self.counts[name] = 0


def _created(vfs: LocalVfs, name: bytes, mode: int = 0o644) -> bytes:
    fh, of, created = vfs.create_file(ROOT, vfs.root_handle(), name, mode)
    assert created
    of.close()
    return fh


@pytest.fixture
def vfs(make_vfs: MakeVfs) -> LocalVfs:
    vfs = make_vfs(root_squash=False)
    assert vfs._res.cloned, "as root the export mount must be cloned"
    return vfs


def test_lookup_of_a_cached_name_opens_nothing_and_makes_no_handle(
    vfs: LocalVfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    fh = _created(vfs, b"f")
    calls = Calls(monkeypatch, (os, "open"), (syscalls, "fd_handle"), (os, "close"))
    assert vfs.lookup(ROOT, vfs.root_handle(), b"f") == fh
    assert calls.counts == {"open": 0, "fd_handle": 0, "close": 0}
    assert vfs.getattr(fh).type == FileType.NF4REG


def _replace_by_file(export: Path, outside: Path) -> None:
    (export / "other").write_bytes(b"other")
    os.rename(export / "other", export / "f")


def _replace_by_symlink(export: Path, outside: Path) -> None:
    os.symlink("/etc/passwd", export / "link")
    os.rename(export / "link", export / "f")


def _move_out(export: Path, outside: Path) -> None:
    os.rename(export / "f", outside / "f")


def _remove(export: Path, outside: Path) -> None:
    os.unlink(export / "f")


@pytest.mark.parametrize(
    "change", [_replace_by_file, _replace_by_symlink, _move_out, _remove], ids=lambda f: f.__name__
)
def test_lookup_of_a_cached_name_that_changed_finds_what_is_there_now(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path, change: Any
) -> None:
    fh = _created(vfs, b"f")
    assert vfs.lookup(ROOT, vfs.root_handle(), b"f") == fh  # the name is known, cached
    outside = tmp_path / "outside"
    outside.mkdir()
    change(export_dir, outside)
    if change in (_move_out, _remove):
        with pytest.raises(FileNotFoundError):
            vfs.lookup(ROOT, vfs.root_handle(), b"f")
        return
    now = vfs.lookup(ROOT, vfs.root_handle(), b"f")
    assert now != fh
    want = FileType.NF4LNK if change is _replace_by_symlink else FileType.NF4REG
    assert vfs.getattr(now).type == want
    if want == FileType.NF4LNK:
        assert vfs.readlink(ROOT, now) == b"/etc/passwd"  # returned, never followed


def test_lookup_of_a_cached_name_still_checks_search_permission(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    vfs = make_vfs(root_squash=False)
    export_dir.chmod(0o777)
    (export_dir / "d").mkdir(mode=0o700)
    d = vfs.lookup(ROOT, vfs.root_handle(), b"d")
    fh, of, _ = vfs.create_file(ROOT, d, b"f", 0o644)
    of.close()
    assert vfs.lookup(ROOT, d, b"f") == fh  # cached now
    with pytest.raises(PermissionError):
        vfs.lookup(U1000, d, b"f")  # no search permission in d for uid 1000
    vfs.release_identity()


def test_remove_of_a_cached_name_opens_nothing_and_its_handle_is_stale(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fh = _created(vfs, b"f")
    calls = Calls(monkeypatch, (os, "open"), (syscalls, "fd_handle"))
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    assert calls.counts == {"open": 0, "fd_handle": 0}
    assert not (export_dir / "f").exists()
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)
    with pytest.raises(FileNotFoundError):
        vfs.remove(ROOT, vfs.root_handle(), b"f")


def test_remove_of_a_cached_name_replaced_by_a_directory(vfs: LocalVfs, export_dir: Path) -> None:
    fh = _created(vfs, b"f")
    os.unlink(export_dir / "f")
    (export_dir / "f").mkdir()
    vfs.remove(ROOT, vfs.root_handle(), b"f")  # the directory, by rmdir
    assert not (export_dir / "f").exists()
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)


def test_remove_of_a_cached_name_left_with_a_link_outside_is_stale_after(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path
) -> None:
    """The object keeps a name outside the export only: its handle must not reach it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    confine.open_window()
    try:
        fh = _created(vfs, b"f")
    finally:
        confine.close_window()
    os.link(export_dir / "f", outside / "f")
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    assert (outside / "f").exists()
    confine.open_window()
    try:
        with pytest.raises(StaleHandle):
            vfs.check(fh)
    finally:
        confine.close_window()


def _in_window(vfs: LocalVfs, fh: bytes) -> None:
    confine.open_window()
    try:
        vfs.check(fh)
    finally:
        confine.close_window()


QUIET_ATTEMPTS = 20
"""Other processes' renames and removals on the same file system end the move watch's epoch
too (tests elsewhere on the machine): a test of what is trusted while nothing moved tries
again (a new name) until one attempt saw no other event, and fails if none did."""


def test_a_created_file_is_trusted_in_later_windows_until_something_moves(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert vfs._res.watched, "the move watch must be active (root, a local file system)"
    calls = Calls(monkeypatch, (os, "readlink"))
    for attempt in range(QUIET_ATTEMPTS):
        name = b"f%d" % attempt
        calls.reset()
        confine.open_window()
        try:
            epoch = confine.MOVES.epoch  # (the window's, after its poll)
            fh, of, _ = vfs.create_file(ROOT, vfs.root_handle(), name, 0o644)
            vfs.check(fh)  # the OPEN's next operations
            of.close()
        finally:
            confine.close_window()
        for _ in range(3):
            _in_window(vfs, fh)  # CLOSE, LOOKUP...: no check needed, nothing moved
        if confine.MOVES.epoch == epoch:
            assert calls.counts["readlink"] == 0
            break
    else:
        pytest.fail("something moved on the file system during every attempt")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(export_dir / os.fsdecode(name), outside / "f")  # moved out by a local process
    confine.open_window()
    try:
        with pytest.raises(StaleHandle):
            vfs.check(fh)
    finally:
        confine.close_window()
    assert calls.counts["readlink"] > 0


def test_a_created_file_replaced_by_a_symlink_is_not_served_through_it(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path
) -> None:
    confine.open_window()
    try:
        fh = _created(vfs, b"f")
    finally:
        confine.close_window()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(export_dir / "f", outside / "f")
    os.symlink(outside / "f", export_dir / "f")
    confine.open_window()
    try:
        with pytest.raises(StaleHandle):
            vfs.check(fh)
        link = vfs.lookup(ROOT, vfs.root_handle(), b"f")
        assert link != fh and vfs.getattr(link).type == FileType.NF4LNK
    finally:
        confine.close_window()


def test_exclusive_create_still_stores_the_verifier(vfs: LocalVfs, export_dir: Path) -> None:
    verf = bytes.fromhex("0123456789abcdef")
    fh, of, created = vfs.create_file(
        ROOT, vfs.root_handle(), b"x", 0o644, CreateMode.EXCLUSIVE, verf
    )
    of.close()
    assert created
    st = os.stat(export_dir / "x")
    assert (st.st_atime_ns, st.st_mtime_ns) == attrs.verifier_times(verf)
    again, of2, created2 = vfs.create_file(
        ROOT, vfs.root_handle(), b"x", 0o644, CreateMode.EXCLUSIVE, verf
    )
    of2.close()
    assert (again, created2) == (fh, True)
    with pytest.raises(FileExistsError):
        vfs.create_file(ROOT, vfs.root_handle(), b"x", 0o644, CreateMode.EXCLUSIVE, b"\1" * 8)


ALL = ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_EXECUTE


def test_access_asks_once_and_refuses_execute_without_an_execute_bit(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fh = _created(vfs, b"f", 0o644)
    prog = _created(vfs, b"prog", 0o744)
    calls = Calls(monkeypatch, (syscalls, "faccessat_empty"))
    # root may read and write anything, execute only what has an execute bit (kernel rule)
    assert vfs.access(ROOT, fh, ALL) == ALL & ~ACCESS4_EXECUTE
    assert calls.counts["faccessat_empty"] == 1
    calls.reset()
    assert vfs.access(ROOT, prog, ALL) == ALL
    assert calls.counts["faccessat_empty"] == 1
    assert os.access(export_dir / "f", os.X_OK) is False  # what the kernel says too


def test_access_splits_when_not_everything_is_granted(vfs: LocalVfs, export_dir: Path) -> None:
    (export_dir / "r").write_bytes(b"r")
    os.chmod(export_dir / "r", 0o645)
    fh = vfs.lookup(ROOT, vfs.root_handle(), b"r")
    assert vfs.access(U1000, fh, ALL) == ACCESS4_READ | ACCESS4_EXECUTE
    vfs.release_identity()  # (this thread acted as uid 1000)
    os.chmod(export_dir / "r", 0o606)
    assert vfs.access(U1000, fh, ALL) == ACCESS4_READ | ACCESS4_MODIFY | ACCESS4_EXTEND
    vfs.release_identity()
    os.chmod(export_dir / "r", 0o600)
    assert vfs.access(U1000, fh, ALL) == 0


def test_access_of_a_mask_is_the_union_of_its_bits(vfs: LocalVfs, export_dir: Path) -> None:
    """Every mask (ACCESS's modes are asked by plans kept per type and mask) answers what its
    bits answer one by one, for a file and a directory, granted or not."""
    (export_dir / "r").write_bytes(b"r")
    os.chmod(export_dir / "r", 0o645)
    (export_dir / "d").mkdir(mode=0o753)
    os.chmod(export_dir / "d", 0o753)
    root = vfs.root_handle()
    for name in (b"r", b"d"):
        fh = vfs.lookup(ROOT, root, name)
        for cred in (ROOT, U1000):
            alone = {1 << k: vfs.access(cred, fh, 1 << k) for k in range(6)}
            for mask in range(64):
                union = 0
                for bit, granted in alone.items():
                    if mask & bit:
                        union |= granted
                assert vfs.access(cred, fh, mask) == union, (name, cred, mask)
            vfs.release_identity()


def test_remove_of_a_cached_name_with_another_link_inside_keeps_its_handle(
    vfs: LocalVfs, export_dir: Path
) -> None:
    fh = _created(vfs, b"f")
    os.link(export_dir / "f", export_dir / "g")
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    assert vfs.getattr(fh).nlink == 1
    assert vfs.lookup(ROOT, vfs.root_handle(), b"g") == fh


def test_remove_of_a_cached_open_file_serves_it_until_closed(
    vfs: LocalVfs, export_dir: Path
) -> None:
    fh, of, _ = vfs.create_file(ROOT, vfs.root_handle(), b"f", 0o644)
    of.write(0, b"data")
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    assert vfs.getattr(fh).size == 4  # removed while open: still served
    of.close()
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)


def test_a_removal_through_the_server_keeps_the_other_descriptors_trusted(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own REMOVE drops the trust of what it removed, so its move-watch event
    does not end the epoch: the next COMPOUND checks nothing again."""
    assert vfs._res.watched
    (export_dir / "d").mkdir()
    d = vfs.lookup(ROOT, vfs.root_handle(), b"d")
    calls = Calls(monkeypatch, (os, "readlink"))
    for attempt in range(QUIET_ATTEMPTS):
        name = b"f%d" % attempt
        fh, of, _ = vfs.create_file(ROOT, d, name, 0o644)
        of.close()
        _in_window(vfs, d)
        calls.reset()
        confine.open_window()
        try:
            epoch = confine.MOVES.epoch
            vfs.remove(ROOT, d, name)
        finally:
            confine.close_window()
        _in_window(vfs, d)
        if confine.MOVES.epoch == epoch:
            assert calls.counts["readlink"] == 0
            break
    else:
        pytest.fail("the epoch ended at every attempt: our own removal ends it, or other moves")
    with pytest.raises(StaleHandle):
        _in_window(vfs, fh)


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "not-cached"])
def test_a_removal_through_the_server_leaving_a_link_outside_is_not_trusted(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path, cached: bool
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), b"f")
    _in_window(vfs, fh)  # checked and kept
    os.link(export_dir / "f", outside / "f")
    _in_window(vfs, fh)  # (the link is no move: nothing ended the epoch)
    if not cached:
        vfs._res.fds.discard(fh)  # REMOVE opens the name and makes its handle
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    with pytest.raises(StaleHandle):
        _in_window(vfs, fh)


def test_a_failed_removal_leaves_no_expected_event(
    vfs: LocalVfs, export_dir: Path, tmp_path: Path
) -> None:
    """A removal that fails makes no event: a local unlink made after it by the same thread
    must still end the epoch."""
    (export_dir / "d").mkdir()
    (export_dir / "d" / "x").write_bytes(b"")
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), b"f")
    _in_window(vfs, fh)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.link(export_dir / "f", outside / "f")
    with pytest.raises(OSError):
        vfs.remove(ROOT, vfs.root_handle(), b"d")  # not empty
    with pytest.raises(FileNotFoundError):
        vfs.remove(ROOT, vfs.root_handle(), b"nothing")
    os.unlink(export_dir / "f")  # a local process's (this thread's) removal
    with pytest.raises(StaleHandle):
        _in_window(vfs, fh)


def test_the_type_of_a_handle_made_here_needs_no_fstat(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fh = _created(vfs, b"f")
    (export_dir / "d").mkdir()
    os.symlink("f", export_dir / "l")
    d = vfs.lookup(ROOT, vfs.root_handle(), b"d")
    link = vfs.lookup(ROOT, vfs.root_handle(), b"l")
    calls = Calls(monkeypatch, (os, "fstat"))
    assert [vfs.file_type(h) for h in (fh, d, link)] == [
        FileType.NF4REG,
        FileType.NF4DIR,
        FileType.NF4LNK,
    ]
    assert calls.counts["fstat"] == 0
    assert vfs.file_type(vfs.root_handle()) == FileType.NF4DIR  # (not made: asked)
    vfs.remove(ROOT, vfs.root_handle(), b"f")
    with pytest.raises(StaleHandle):
        vfs.file_type(fh)


def test_open_of_a_handle_made_here_needs_no_fstat(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPEN's reopen for I/O (RFC 8881 §18.16) asks the type the resolver knows: no fstat;
    the other types keep their errors, and a refused open still gets its exceptions (the
    owner's and knfsd's read-if-exec), which need the mode: it is asked then."""
    fh = _created(vfs, b"f")
    (export_dir / "d").mkdir()
    os.symlink("f", export_dir / "l")
    d = vfs.lookup(ROOT, vfs.root_handle(), b"d")
    link = vfs.lookup(ROOT, vfs.root_handle(), b"l")
    (export_dir / "prog").write_bytes(b"\x7fELF")
    os.chown(export_dir / "prog", 1000, 1000)
    os.chmod(export_dir / "prog", 0o711)
    prog = vfs.lookup(ROOT, vfs.root_handle(), b"prog")
    calls = Calls(monkeypatch, (os, "fstat"))
    of = vfs.open(ROOT, fh, read=True, write=True)
    assert of.write(0, b"data") == 4
    of.close()
    assert calls.counts["fstat"] == 0
    with pytest.raises(IsADirectoryError):
        vfs.open(ROOT, d, read=True, write=False)
    with pytest.raises(OSError) as e:
        vfs.open(ROOT, link, read=True, write=False)
    assert e.value.errno == errno.ELOOP
    assert calls.counts["fstat"] == 0
    of = vfs.open(U1001, prog, read=True, write=False)  # refused by mode, allowed: exec
    assert of.read(0, 4) == (b"\x7fELF", True)
    of.close()
    with pytest.raises(PermissionError):
        vfs.open(U1001, prog, read=True, write=True)
    vfs.release_identity()


def _window() -> None:
    confine.close_window()
    confine.open_window()


def test_getattr_right_after_access_or_lookup_in_a_window_makes_no_fstat(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Linux client's OPEN+GETFH+ACCESS+GETATTR and LOOKUP+GETFH+GETATTR: the GETATTR
    takes the fstat (or the name's fstatat) made by the VFS call just before, in the same
    check window; outside a window, or in the next one, it asks again."""
    fh = _created(vfs, b"f")
    (export_dir / "new").write_bytes(b"12345")
    calls = Calls(monkeypatch, (os, "fstat"), (os, "stat"))
    confine.open_window()
    try:
        assert vfs.access(ROOT, fh, ACCESS4_READ) == ACCESS4_READ
        assert calls.counts == {"fstat": 1, "stat": 0}
        assert vfs.getattr(fh).size == 0
        assert calls.counts == {"fstat": 1, "stat": 0}
        assert vfs.getattr(fh).size == 0  # a second GETATTR asks (kept for one only)
        assert calls.counts == {"fstat": 2, "stat": 0}
        calls.reset()
        assert vfs.lookup(ROOT, vfs.root_handle(), b"f") == fh  # a cached name: fstatat
        assert vfs.getattr(fh).type == FileType.NF4REG
        assert calls.counts == {"fstat": 0, "stat": 1}
        calls.reset()
        new = vfs.lookup(ROOT, vfs.root_handle(), b"new")  # opened: make_handle's fstat
        assert vfs.getattr(new).size == 5
        assert calls.counts == {"fstat": 1, "stat": 0}
        calls.reset()
        vfs.access(ROOT, fh, ACCESS4_READ)
        _window()  # the COMPOUND waited, or ended: a new window
        vfs.getattr(fh)
        assert calls.counts == {"fstat": 2, "stat": 0}
    finally:
        confine.close_window()
    calls.reset()
    vfs.access(ROOT, fh, ACCESS4_READ)  # no window: nothing kept
    vfs.getattr(fh)
    assert calls.counts == {"fstat": 2, "stat": 0}


def test_getattr_after_access_sees_every_change_the_server_made_in_between(
    vfs: LocalVfs, export_dir: Path
) -> None:
    """A modification by the server (any object, any thread: the change counter's
    generation) or another resolution between them drops the kept stat: the change attribute
    and size a GETATTR reports always follow the server's own changes (RFC 8881 §5.8.1.4)."""
    fh = _created(vfs, b"f")
    other = _created(vfs, b"g")
    confine.open_window()
    try:
        before = vfs.getattr(fh)
        vfs.access(ROOT, fh, ACCESS4_READ)
        of = vfs.open(ROOT, fh, read=True, write=True)  # (a resolution too)
        vfs.access(ROOT, fh, ACCESS4_READ)
        assert of.write(0, b"data") == 4  # a WRITE after the ACCESS: bumps the change count
        after = vfs.getattr(fh)
        assert after.size == 4 and after.change != before.change
        vfs.access(ROOT, fh, ACCESS4_READ)
        vfs.setattr(ROOT, other, mode=0o600)  # another object modified by the server
        assert vfs.getattr(fh).change == after.change
        vfs.access(ROOT, fh, ACCESS4_READ)
        assert of.write(4, b"more") == 4
        assert vfs.getattr(fh).size == 8
        of.close()
        vfs.access(ROOT, fh, ACCESS4_READ)
        vfs.check(other)  # another resolution in between: asked again
        os.truncate(export_dir / "f", 1)  # (another process; seen since asked again)
        assert vfs.getattr(fh).size == 1
    finally:
        confine.close_window()


def test_a_local_change_after_access_shows_from_the_next_window(
    vfs: LocalVfs, export_dir: Path
) -> None:
    """A change by another process between ACCESS and GETATTR of one COMPOUND is concurrent
    with it: the GETATTR may report the object as the ACCESS saw it (a moment within the
    COMPOUND), and the next COMPOUND sees the change."""
    fh = _created(vfs, b"f")
    confine.open_window()
    try:
        vfs.access(ROOT, fh, ACCESS4_READ)
        os.truncate(export_dir / "f", 3)
        assert vfs.getattr(fh).size == 0  # as the ACCESS saw it
        _window()
        assert vfs.getattr(fh).size == 3
    finally:
        confine.close_window()


def test_access_and_getattr_after_an_exclusive_create_take_its_fstat(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPEN(EXCLUSIVE4_1 create)+GETFH+ACCESS+GETATTR: the created file's fstat, made after
    the verifier is stored (RFC 8881 §18.16.3), serves ACCESS and GETATTR; the directory's
    change (OPEN's change_info) and the type in between keep it. The attributes are those
    of the file on disk, verifier times included."""
    verf = bytes.fromhex("0123456789abcdef")
    calls = Calls(monkeypatch, (os, "fstat"))
    confine.open_window()
    try:
        fh, of, created = vfs.create_file(
            ROOT, vfs.root_handle(), b"x", 0o644, CreateMode.EXCLUSIVE, verf
        )
        assert created and calls.counts["fstat"] == 1
        vfs.change(vfs.root_handle())  # (change_info after: the directory's own fstat)
        assert vfs.file_type(fh) == FileType.NF4REG
        assert vfs.access(ROOT, fh, ALL) == ALL & ~ACCESS4_EXECUTE
        got = vfs.getattr(fh)
        assert calls.counts["fstat"] == 2
    finally:
        confine.close_window()
    of.close()
    st = os.stat(export_dir / "x")
    assert (got.atime_ns, got.mtime_ns) == attrs.verifier_times(verf)
    assert (got.atime_ns, got.mtime_ns, got.ctime_ns) == (
        st.st_atime_ns,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )
    assert got.mode & 0o7777 == 0o644


def test_access_and_getattr_after_open_by_name_take_the_lookup_stat(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OPEN(no create)+GETFH+ACCESS+GETATTR, the Linux client's open(2) of a file: the name's
    fstatat made by OPEN's lookup serves ACCESS and GETATTR, since opening the file for I/O
    changes none of its attributes; an open that truncates does, and is asked again."""
    fh = _created(vfs, b"f")
    (export_dir / "f").write_bytes(b"12345")
    root = vfs.root_handle()
    calls = Calls(monkeypatch, (os, "fstat"), (os, "stat"))
    confine.open_window()
    try:
        assert vfs.open_lookup(ROOT, root, b"f")[1] == fh  # the directory's fstat, fstatat
        of = vfs.open(ROOT, fh, read=True, write=False)
        assert vfs.access(ROOT, fh, ACCESS4_READ) == ACCESS4_READ
        assert vfs.getattr(fh).size == 5
        assert calls.counts == {"fstat": 1, "stat": 1}
        of.close()
        calls.reset()
        vfs.open_lookup(ROOT, root, b"f")
        of = vfs.open(ROOT, fh, read=False, write=True, truncate=True)
        assert vfs.getattr(fh).size == 0
        assert calls.counts == {"fstat": 2, "stat": 1}
        of.close()
    finally:
        confine.close_window()


def test_a_created_file_whose_mode_was_fixed_is_asked_again(
    vfs: LocalVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bits the process umask took are given back by a chmod after the fstat: that
    fstat is not kept, and ACCESS and GETATTR see the mode the file has."""
    monkeypatch.setattr(vfs, "_umask", 0o022)
    confine.open_window()
    try:
        fh, of, _ = vfs.create_file(ROOT, vfs.root_handle(), b"w", 0o777)
        assert vfs.access(ROOT, fh, ACCESS4_EXECUTE) == ACCESS4_EXECUTE
        got = vfs.getattr(fh)
    finally:
        confine.close_window()
    of.close()
    assert got.mode & 0o7777 == 0o777
    assert got.ctime_ns == os.stat(export_dir / "w").st_ctime_ns
