"""Hostile names: LOOKUP takes exactly one component (EINVAL / ENAMETOOLONG otherwise)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.vfs import FileType, LocalVfs
from nfsrdma.vfs.confine import check_name

from .conftest import ROOT, needs_root

pytestmark = needs_root

BAD_NAMES = [b"", b".", b"..", b"a/b", b"/", b"/etc", b"../etc", b"a\0b", b"\0", "x/y", ".."]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_rejected_by_every_operation(vfs: LocalVfs, name: bytes | str) -> None:
    root = vfs.root_handle()
    fh, of, _ = vfs.create_file(ROOT, root, b"f", 0o644)
    of.close()
    calls: list[Callable[[], object]] = [
        lambda: vfs.lookup(ROOT, root, name),
        lambda: vfs.create_file(ROOT, root, name, 0o644),
        lambda: vfs.create(ROOT, root, name, FileType.NF4DIR, 0o755),
        lambda: vfs.remove(ROOT, root, name),
        lambda: vfs.rename(ROOT, root, b"f", root, name),
        lambda: vfs.rename(ROOT, root, name, root, b"g"),
        lambda: vfs.link(ROOT, fh, root, name),
    ]
    for call in calls:
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.EINVAL
    assert sorted(e.name for e in vfs.readdir(ROOT, root).entries) == [b"f"]


def test_name_length_limit(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    ok = b"n" * 255
    vfs.create(ROOT, root, ok, FileType.NF4DIR, 0o755)
    assert vfs.getattr(vfs.lookup(ROOT, root, ok)).type == FileType.NF4DIR
    with pytest.raises(OSError) as ei:
        vfs.lookup(ROOT, root, ok + b"n")
    assert ei.value.errno == errno.ENAMETOOLONG
    with pytest.raises(OSError) as ei:
        vfs.create_file(ROOT, root, "é" * 128, 0o644)  # 256 octets in UTF-8
    assert ei.value.errno == errno.ENAMETOOLONG


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=300))
def test_check_name_accepts_exactly_single_components(name: bytes) -> None:
    single = name not in (b".", b"..") and b"/" not in name and b"\0" not in name
    if single and len(name) <= 255:
        assert check_name(name) == name
    else:
        with pytest.raises(OSError) as ei:
            check_name(name)
        expected = errno.EINVAL if not single else errno.ENAMETOOLONG
        assert ei.value.errno == expected


@settings(max_examples=40, deadline=None)
@given(
    st.binary(min_size=1, max_size=60).filter(
        lambda n: n not in (b".", b"..") and b"/" not in n and b"\0" not in n
    )
)
def test_any_valid_byte_name_round_trips(
    tmp_path_factory: pytest.TempPathFactory, name: bytes
) -> None:
    """Non-UTF-8 names are legal on Linux and must survive create → readdir → lookup."""
    from nfsrdma.vfs import Export

    d = tmp_path_factory.mktemp("names")
    (d / "e").mkdir()
    vfs = LocalVfs(Export(str(d / "e"), state_dir=str(d / "s"), root_squash=False))
    try:
        root = vfs.root_handle()
        fh, of, created = vfs.create_file(ROOT, root, name, 0o600)
        of.close()
        assert created
        assert [e.name for e in vfs.readdir(ROOT, root).entries] == [name]
        assert vfs.lookup(ROOT, root, name) == fh
        assert os.path.exists(os.path.join(os.fsencode(d / "e"), name))
    finally:
        vfs.close()
