"""VFS calls that stand for several, with one resolution of the directory in the local backend.
Their answers and errors must be those of the base class's composition, in every handle and
mount mode:

* ``Vfs.open_lookup``: what OPEN by name without a create asks (the directory's change
  attribute, the name's handle and its object's type: ``change``, ``file_type``, ``lookup``,
  ``file_type``);
* ``Vfs.remove_changed``: REMOVE with its change_info (``change``, ``remove``, ``change``);
* ``Vfs.create_changed``: OPEN's create with its change_info (``change``, ``file_type``,
  ``create_file``, ``change``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.vfs import CreateMode, FileType, LocalVfs, StaleHandle, Vfs, confine
from nfsrdma.vfs.resolver import Resolver

from .conftest import ROOT, U1000, MakeVfs, needs_root, spies_see_resolution
from .test_meta_syscalls import Calls

pytestmark = needs_root

MODES = [
    pytest.param({}, id="auto"),
    pytest.param({"handle_mode": "cache"}, id="cache"),
    pytest.param({"clone_mount": False}, id="no-clone"),
]


def _tree(export: Path) -> None:
    export.chmod(0o777)
    (export / "file").write_bytes(b"data")
    (export / "dir").mkdir()
    os.symlink("file", export / "link")
    os.mkfifo(export / "fifo")
    (export / "private").mkdir(mode=0o700)
    (export / "private" / "f").write_bytes(b"")


def _both(vfs: LocalVfs, dir_fh: bytes, name: bytes, cred: Any = ROOT) -> tuple[Any, Any]:
    """(LocalVfs's answer, the base class's) as values or exception types."""
    out = []
    for call in (vfs.open_lookup, lambda *a: Vfs.open_lookup(vfs, *a)):
        try:
            out.append(call(cred, dir_fh, name))
        except Exception as e:
            out.append(type(e))
    vfs.release_identity()
    return out[0], out[1]


@pytest.fixture(params=MODES)
def tree_vfs(request: pytest.FixtureRequest, make_vfs: MakeVfs, export_dir: Path) -> LocalVfs:
    """The tree of ``_tree`` served in each handle and mount mode."""
    _tree(export_dir)
    vfs: LocalVfs = make_vfs(root_squash=False, **request.param)
    return vfs


def test_answers_and_errors_are_the_four_calls(tree_vfs: LocalVfs) -> None:
    vfs = tree_vfs
    root = vfs.root_handle()
    want = {
        b"file": FileType.NF4REG,
        b"dir": FileType.NF4DIR,
        b"link": FileType.NF4LNK,
        b"fifo": FileType.NF4FIFO,
    }
    for name, ftype in want.items():
        for _ in range(2):  # the name unknown, then known (its descriptor cached)
            mine, base = _both(vfs, root, name)
            assert mine == base
            change, fh, got = mine
            assert got == ftype
            assert change == vfs.change(root)
            assert fh == vfs.lookup(ROOT, root, name)
    assert _both(vfs, root, b"missing") == (FileNotFoundError, FileNotFoundError)
    file_fh = vfs.lookup(ROOT, root, b"file")
    link_fh = vfs.lookup(ROOT, root, b"link")
    assert _both(vfs, file_fh, b"x") == (NotADirectoryError, NotADirectoryError)
    assert _both(vfs, link_fh, b"x") == (NotADirectoryError, NotADirectoryError)
    # the caller's search permission is checked
    private = vfs.lookup(ROOT, root, b"private")
    mine, base = _both(vfs, private, b"f")
    assert mine == base and mine[2] == FileType.NF4REG
    assert _both(vfs, private, b"f", U1000) == (PermissionError, PermissionError)


def test_a_removed_directory_is_stale_before_its_name_is_asked(
    tree_vfs: LocalVfs, export_dir: Path
) -> None:
    vfs = tree_vfs
    d = vfs.lookup(ROOT, vfs.root_handle(), b"dir")
    os.rmdir(export_dir / "dir")
    assert _both(vfs, d, b"missing") == (StaleHandle, StaleHandle)


@spies_see_resolution
def test_one_resolution_of_the_directory_and_none_of_the_object(
    make_vfs: MakeVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(export_dir)
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    fh = vfs.lookup(ROOT, root, b"file")  # known: the fstatat path
    pinned = _pins(monkeypatch)
    assert vfs.open_lookup(ROOT, root, b"file")[1:] == (fh, FileType.NF4REG)
    assert pinned == [root]
    vfs.remove_changed(ROOT, root, b"file")
    assert pinned == [root, root]


def _remove_both(vfs: LocalVfs, dir_fh: bytes, name: bytes) -> tuple[Any, Any]:
    """(LocalVfs's remove_changed, the base class's) as exception types, or "ok" after checking
    the change attributes against the directory's own, read just before and just after."""
    out = []
    for call in (vfs.remove_changed, lambda *a: Vfs.remove_changed(vfs, *a)):
        try:
            want_before = vfs.change(dir_fh)
        except Exception:
            want_before = None
        try:
            before, after = call(ROOT, dir_fh, name)
        except Exception as e:
            out.append(type(e))
            continue
        assert before == want_before
        assert after == vfs.change(dir_fh) and after != before
        out.append("ok")
    vfs.release_identity()
    return out[0], out[1]


def test_remove_changed_answers_and_errors_are_the_three_calls(
    tree_vfs: LocalVfs, export_dir: Path
) -> None:
    vfs = tree_vfs
    root = vfs.root_handle()
    for name in (b"file", b"dir", b"link", b"fifo"):
        if name != b"fifo":
            vfs.lookup(ROOT, root, name)  # known (LocalVfs's fstatat path) or not (a fifo)
        want_before = vfs.change(root)
        before, after = vfs.remove_changed(ROOT, root, name)
        assert (before, after) == (want_before, vfs.change(root)) and before != after
        assert not os.path.lexists(export_dir / os.fsdecode(name))
    (export_dir / "file").write_bytes(b"")
    (export_dir / "link2").symlink_to("file")
    assert _both_removed(vfs, root, [b"file", b"link2"])
    assert _remove_both(vfs, root, b"missing") == (FileNotFoundError, FileNotFoundError)
    (export_dir / "full").mkdir()
    (export_dir / "full" / "x").write_bytes(b"")
    assert _remove_both(vfs, root, b"full") == (OSError, OSError)
    d = vfs.lookup(ROOT, root, b"full")
    os.unlink(export_dir / "full" / "x")
    os.rmdir(export_dir / "full")
    assert _remove_both(vfs, d, b"x") == (StaleHandle, StaleHandle)


def _both_removed(vfs: LocalVfs, root: bytes, names: list[bytes]) -> bool:
    """Each implementation removes one of ``names``, with the right change_info."""
    mine = vfs.remove_changed(ROOT, root, names[0])
    assert mine[1] == vfs.change(root)
    base = Vfs.remove_changed(vfs, ROOT, root, names[1])
    assert base[1] == vfs.change(root)
    vfs.release_identity()
    return True


def test_remove_changed_on_a_read_only_export(make_vfs: MakeVfs, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    vfs = make_vfs(root_squash=False, read_only=True)
    root = vfs.root_handle()
    assert _remove_both(vfs, root, b"f") == (OSError, OSError)
    with pytest.raises(OSError) as e:
        vfs.remove_changed(ROOT, root, b"f")
    assert e.value.errno == errno.EROFS
    assert (export_dir / "f").exists()


def _pins(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The handles resolved (``Resolver.pin``) from now on, in order."""
    pinned: list[bytes] = []
    real = Resolver.pin

    def pin(self: Resolver, key: bytes) -> Any:
        pinned.append(key)
        return real(self, key)

    monkeypatch.setattr(Resolver, "pin", pin)
    return pinned


_VERIFIER = b"verifier"


def _create_both(
    vfs: LocalVfs, dir_fh: bytes, names: tuple[bytes, bytes], how: CreateMode, cred: Any = ROOT
) -> tuple[Any, Any]:
    """(LocalVfs's create_changed of ``names[0]``, the base class's of ``names[1]``): as
    exception types, or (created, whether the change attributes are the directory's own read
    just before and just after, whether the handle is the name's, the open file's modes)."""
    out = []
    calls = (vfs.create_changed, lambda *a, **k: Vfs.create_changed(vfs, *a, **k))
    for call, name in zip(calls, names, strict=True):
        try:
            want_before = vfs.change(dir_fh)
        except Exception:
            want_before = None
        try:
            before, fh, of, created, after = call(
                cred, dir_fh, name, 0o640, how, _VERIFIER, read=False, write=True
            )
        except Exception as e:
            out.append(type(e))
            continue
        try:
            changes = (before == want_before, after == vfs.change(dir_fh), after != before)
            out.append(
                (created, changes, fh == vfs.lookup(ROOT, dir_fh, name), of.readable, of.writable)
            )
        finally:
            of.close()
    vfs.release_identity()
    return out[0], out[1]


def test_create_changed_answers_and_errors_are_the_four_calls(
    tree_vfs: LocalVfs, export_dir: Path
) -> None:
    vfs = tree_vfs
    root = vfs.root_handle()
    made = (True, (True, True, True), True, True, True)  # (a created file is opened for both)
    for how in (CreateMode.UNCHECKED, CreateMode.GUARDED, CreateMode.EXCLUSIVE):
        names = (b"mine-%d" % how.value, b"base-%d" % how.value)
        assert _create_both(vfs, root, names, how) == (made, made)
    # the names exist now: not created (UNCHECKED; EXCLUSIVE with the same verifier, a retry),
    # FileExistsError (GUARDED); before == after when nothing was created
    kept = (False, (True, True, False), True, False, True)
    exclusive = (b"mine-%d" % CreateMode.EXCLUSIVE.value, b"base-%d" % CreateMode.EXCLUSIVE.value)
    retried = (True, (True, True, False), True, True, True)  # (answered as the first attempt)
    assert _create_both(vfs, root, exclusive, CreateMode.EXCLUSIVE) == (retried, retried)
    unchecked = (b"mine-%d" % CreateMode.UNCHECKED.value, b"base-%d" % CreateMode.UNCHECKED.value)
    assert _create_both(vfs, root, unchecked, CreateMode.UNCHECKED) == (kept, kept)
    guarded = (FileExistsError, FileExistsError)
    assert _create_both(vfs, root, unchecked, CreateMode.GUARDED) == guarded
    assert _create_both(vfs, root, (b"dir", b"dir"), CreateMode.GUARDED) == guarded
    # not a directory (a file, a symlink), no write permission, a bad name, a removed directory
    for not_dir in (b"file", b"link"):
        fh = vfs.lookup(ROOT, root, not_dir)
        want = (NotADirectoryError, NotADirectoryError)
        assert _create_both(vfs, fh, (b"x", b"y"), CreateMode.UNCHECKED) == want
    private = vfs.lookup(ROOT, root, b"private")
    denied = (PermissionError, PermissionError)
    assert _create_both(vfs, private, (b"x", b"y"), CreateMode.UNCHECKED, U1000) == denied
    assert _create_both(vfs, root, (b"a/b", b"a/b"), CreateMode.UNCHECKED) == (OSError, OSError)
    d = vfs.lookup(ROOT, root, b"dir")
    os.rmdir(export_dir / "dir")
    assert _create_both(vfs, d, (b"x", b"y"), CreateMode.UNCHECKED) == (StaleHandle, StaleHandle)


def test_create_changed_on_a_read_only_export(make_vfs: MakeVfs, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"")
    vfs = make_vfs(root_squash=False, read_only=True)
    root = vfs.root_handle()
    assert _create_both(vfs, root, (b"x", b"y"), CreateMode.UNCHECKED) == (OSError, OSError)
    file_fh = vfs.lookup(ROOT, root, b"f")  # (not a directory: said first)
    want = (NotADirectoryError, NotADirectoryError)
    assert _create_both(vfs, file_fh, (b"x", b"y"), CreateMode.UNCHECKED) == want
    with pytest.raises(OSError) as e:
        vfs.create_changed(ROOT, root, b"x", 0o644)
    assert e.value.errno == errno.EROFS
    assert not (export_dir / "x").exists()


@spies_see_resolution
def test_create_changed_resolves_the_directory_once_and_keeps_the_new_stat(
    make_vfs: MakeVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One resolution of the directory for the four calls; the created file's fstat still
    serves a GETATTR right after (the directory's second fstat does not drop it)."""
    _tree(export_dir)
    vfs = make_vfs(root_squash=False)
    root = vfs.root_handle()
    pinned = _pins(monkeypatch)
    calls = Calls(monkeypatch, (os, "fstat"))
    confine.open_window()
    try:
        before, fh, of, created, after = vfs.create_changed(
            ROOT, root, b"new", 0o644, CreateMode.EXCLUSIVE, _VERIFIER
        )
        got = vfs.getattr(fh)
    finally:
        confine.close_window()
    assert pinned == [root, fh] and created and before != after
    # the directory before and after, the new file; none for the GETATTR
    assert calls.counts == {"fstat": 3}
    assert got == vfs.getattr(fh)
    of.close()
