"""The move watch (vfs/confine.py ``MoveWatch``): a descriptor found inside the export stays
trusted in later check windows only while no name was moved or removed on its file system.

These tests run as root on a local file system (what CI has): the watch must be active there,
and a test that finds it inactive fails. Each change a local process can make to move an
object out of the export (a rename of the object or of an ancestor, an unlink of the name that
kept it inside) is made between two windows, and the second window must find it out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.vfs import LocalVfs, StaleHandle, confine

from .conftest import ROOT, MakeVfs, needs_root, spies_see_resolution

pytestmark = needs_root
MODES = [
    pytest.param({}, id="kernel-clone"),
    pytest.param({"clone_mount": False}, id="kernel-noclone"),
    pytest.param({"handle_mode": "cache"}, id="cache-clone"),
    pytest.param({"handle_mode": "cache", "clone_mount": False}, id="cache-noclone"),
]


class ReadlinkCount:
    """Counts the confinement check's ``readlink`` calls (the real call still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = os.readlink

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(os, "readlink", counted)


@pytest.fixture
def readlinks(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadlinkCount]:
    yield ReadlinkCount(monkeypatch)


def in_window(vfs: LocalVfs, fh: bytes) -> None:
    """One COMPOUND's worth: a window, the handle checked in it."""
    confine.open_window()
    try:
        vfs.check(fh)
    finally:
        confine.close_window()


@pytest.mark.parametrize("options", MODES)
def test_a_descriptor_checked_once_is_trusted_in_later_windows_until_something_moves(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, options: dict[str, Any], readlinks: Any
) -> None:
    vfs = make_vfs(root_squash=False, **options)
    assert vfs._res.watched, "the move watch must be active (root, a local file system)"
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    in_window(vfs, fh)  # checked (readlink) and kept
    before = readlinks.calls
    for _ in range(3):
        in_window(vfs, fh)
    assert readlinks.calls == before  # nothing moved: no readlink in later windows
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "unrelated").write_bytes(b"")
    os.rename(outside / "unrelated", outside / "moved")  # any move on the file system ...
    in_window(vfs, fh)
    assert readlinks.calls > before  # ... makes the next window check again
    os.rename(export_dir / "f", outside / "f")  # and an object moved out is seen
    with pytest.raises(StaleHandle):
        in_window(vfs, fh)


@pytest.mark.parametrize("options", MODES)
def test_an_ancestor_moved_out_between_windows_is_seen(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    vfs = make_vfs(root_squash=False, **options)
    assert vfs._res.watched
    (export_dir / "a" / "b").mkdir(parents=True)
    (export_dir / "a" / "b" / "f").write_bytes(b"x")
    a = vfs.lookup(ROOT, vfs.root_handle(), "a")
    b = vfs.lookup(ROOT, a, "b")
    f = vfs.lookup(ROOT, b, "f")
    for fh in (a, b, f):
        in_window(vfs, fh)
        in_window(vfs, fh)  # trusted now
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(export_dir / "a", outside / "a")
    for fh in (b, f):
        with pytest.raises(StaleHandle):
            in_window(vfs, fh)


@pytest.mark.parametrize("options", MODES)
def test_a_name_unlinked_between_windows_leaving_a_link_outside_is_seen(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    vfs = make_vfs(root_squash=False, **options)
    assert vfs._res.watched
    outside = tmp_path / "outside"
    outside.mkdir()
    (export_dir / "f").write_bytes(b"x")
    os.link(export_dir / "f", outside / "f")  # a second name, outside the export
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    in_window(vfs, fh)
    in_window(vfs, fh)
    os.unlink(export_dir / "f")  # only the name outside is left
    with pytest.raises(StaleHandle):
        in_window(vfs, fh)


def test_without_the_watch_every_window_checks(
    make_vfs: MakeVfs, export_dir: Path, readlinks: Any
) -> None:
    vfs = make_vfs(root_squash=False, watch_moves=False)
    assert not vfs._res.watched
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    in_window(vfs, fh)
    before = readlinks.calls
    for _ in range(3):
        in_window(vfs, fh)
    assert readlinks.calls == before + 3


def test_outside_a_window_nothing_is_trusted(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, readlinks: Any
) -> None:
    vfs = make_vfs(root_squash=False)
    assert vfs._res.watched
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    in_window(vfs, fh)
    before = readlinks.calls
    vfs.check(fh)  # as the I/O thread pool's uses: no window
    assert readlinks.calls == before + 1


def test_a_watch_that_failed_trusts_nothing(
    make_vfs: MakeVfs, export_dir: Path, readlinks: Any
) -> None:
    vfs = make_vfs(root_squash=False)
    assert vfs._res.watched
    (export_dir / "f").write_bytes(b"x")
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    in_window(vfs, fh)
    confine.MOVES.lost = True
    try:
        before = readlinks.calls
        in_window(vfs, fh)
        assert readlinks.calls == before + 1
    finally:
        confine.MOVES.lost = False


@spies_see_resolution
def test_a_trusted_check_pins_nothing_and_a_dropped_descriptor_is_resolved_again(
    make_vfs: MakeVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch, readlinks: Any
) -> None:
    """PUTFH's check of a handle the watch still trusts (``Resolver.check``) takes no pin of
    the descriptor cache (nothing uses the descriptor) but keeps the entry the most recently
    used one; a descriptor dropped from the cache meanwhile is resolved and checked again."""
    vfs = make_vfs(root_squash=False)
    assert vfs._res.watched
    (export_dir / "f").write_bytes(b"x")
    (export_dir / "g").write_bytes(b"y")
    fh = vfs.lookup(ROOT, vfs.root_handle(), "f")
    other = vfs.lookup(ROOT, vfs.root_handle(), "g")
    in_window(vfs, fh)  # checked (readlink) and kept
    fds = vfs._res.fds
    pins: list[bytes] = []
    acquire = fds.acquire

    def counted(key: bytes) -> Any:
        pins.append(key)
        return acquire(key)

    monkeypatch.setattr(fds, "acquire", counted)
    vfs.check(other)  # (outside a window: pinned and checked)
    assert list(fds._entries)[-1] == other
    before = readlinks.calls
    in_window(vfs, fh)
    assert pins == [other]  # no pin for fh
    assert list(fds._entries)[-1] == fh  # ... but used most recently
    assert readlinks.calls == before
    fds.discard(fh)  # dropped (evicted, or its object gone)
    in_window(vfs, fh)
    assert pins[-1] == fh and fh in fds._entries  # resolved again through a pin
