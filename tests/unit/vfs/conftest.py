"""Fixtures for the VFS tests: an export directory, a state directory and a VFS factory.

Most tests need root (CI runs as root): identity switching, open_by_handle_at, chown.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.vfs import Cred, Export, LocalVfs, resolver

ROOT = Cred(0, 0, ())
U1000 = Cred(1000, 1000, ())
U1001 = Cred(1001, 1001, ())

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")
# Spies that replace a method of the resolver or its descriptor cache see its callers' calls
# only in the pure build: compiled, those are native classes whose callers call the methods
# directly (and an instance's methods cannot be replaced). Those tests run on the pure build.
spies_see_resolution = pytest.mark.skipif(
    not str(resolver.__file__).endswith(".py"),
    reason="compiled vfs/resolver.py: native methods cannot be spied on",
)

MakeVfs = Callable[..., LocalVfs]


@pytest.fixture
def export_dir(tmp_path: Path) -> Path:
    d = tmp_path / "export"
    d.mkdir()
    d.chmod(0o755)
    return d


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def make_vfs(export_dir: Path, state_dir: Path) -> Iterator[MakeVfs]:
    """``make_vfs(read_only=..., root_squash=..., handle_mode=..., ...)`` → LocalVfs."""
    made: list[LocalVfs] = []
    export_fields = {"read_only", "root_squash", "anon_uid", "anon_gid", "root", "state_dir"}

    def make(**kw: Any) -> LocalVfs:
        opts = {k: kw.pop(k) for k in list(kw) if k in export_fields}
        opts.setdefault("root", str(export_dir))
        opts.setdefault("state_dir", str(state_dir))
        vfs = LocalVfs(Export(**opts), **kw)
        made.append(vfs)
        return vfs

    yield make
    for vfs in made:
        vfs.release_identity()  # the test thread must get its own identity back
        vfs.close()


@pytest.fixture
def vfs(make_vfs: MakeVfs) -> LocalVfs:
    """A read-write export with no_root_squash (root acts as root)."""
    return make_vfs(root_squash=False)
