"""A read-only export refuses every modification with EROFS (→ NFS4ERR_ROFS)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from nfsrdma.vfs import (
    ACCESS4_DELETE,
    ACCESS4_EXTEND,
    ACCESS4_LOOKUP,
    ACCESS4_MODIFY,
    ACCESS4_READ,
    SET_TO_SERVER_TIME,
    CreateMode,
    FileType,
)

from .conftest import ROOT, MakeVfs, needs_root

pytestmark = needs_root


def test_every_modification_is_refused(make_vfs: MakeVfs, export_dir: Path) -> None:
    (export_dir / "f").write_bytes(b"data")
    (export_dir / "d").mkdir()
    vfs = make_vfs(read_only=True, root_squash=False)
    root = vfs.root_handle()
    f = vfs.lookup(ROOT, root, b"f")
    d = vfs.lookup(ROOT, root, b"d")
    attempts: list[Callable[[], object]] = [
        lambda: vfs.open(ROOT, f, read=False, write=True),
        lambda: vfs.open(ROOT, f, read=True, write=True),
        lambda: vfs.open(ROOT, f, read=True, write=True, truncate=True),
        lambda: vfs.anonymous_write(ROOT, f, 0, b"x"),
        lambda: vfs.create_file(ROOT, root, b"new", 0o644),
        lambda: vfs.create_file(ROOT, root, b"f", 0o644, CreateMode.UNCHECKED),
        lambda: vfs.create_file(ROOT, root, b"x", 0o644, CreateMode.EXCLUSIVE, b"12345678"),
        lambda: vfs.create(ROOT, root, b"dd", FileType.NF4DIR, 0o755),
        lambda: vfs.create(ROOT, root, b"l", FileType.NF4LNK, 0, linkdata=b"f"),
        lambda: vfs.create(ROOT, root, b"p", FileType.NF4FIFO, 0o644),
        lambda: vfs.remove(ROOT, root, b"f"),
        lambda: vfs.remove(ROOT, root, b"d"),
        lambda: vfs.rename(ROOT, root, b"f", d, b"f"),
        lambda: vfs.link(ROOT, f, d, b"f2"),
        lambda: vfs.setattr(ROOT, f, mode=0o600),
        lambda: vfs.setattr(ROOT, f, size=0),
        lambda: vfs.setattr(ROOT, f, uid=1),
        lambda: vfs.setattr(ROOT, f, mtime=SET_TO_SERVER_TIME),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as ei:
            attempt()
        assert ei.value.errno == errno.EROFS
    # Reading still works and nothing changed.
    assert vfs.anonymous_read(ROOT, f, 0, 10) == (b"data", True)
    assert vfs.access(ROOT, d, 0x3F) == ACCESS4_READ | ACCESS4_LOOKUP
    assert vfs.access(ROOT, f, ACCESS4_MODIFY | ACCESS4_EXTEND | ACCESS4_DELETE) == 0
    vfs.release_identity()
    assert sorted(p.name for p in export_dir.iterdir()) == ["d", "f"]
    assert (export_dir / "f").read_bytes() == b"data"
