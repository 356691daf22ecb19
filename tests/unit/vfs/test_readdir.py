"""READDIR: stable cookies (0 starts, 1 and 2 reserved), pages, attributes, permissions."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nfsrdma.vfs import BadCookie, FileType, LocalVfs
from nfsrdma.vfs.dircookies import CookieJar

from .conftest import ROOT, U1000, U1001, MakeVfs, needs_root

pytestmark = needs_root


def _all(vfs: LocalVfs, fh: bytes, page: int) -> list[bytes]:
    names: list[bytes] = []
    cookie, verf = 0, b""
    while True:
        listing = vfs.readdir(ROOT, fh, cookie, verf, max_entries=page)
        names += [e.name for e in listing.entries]
        if listing.eof:
            return names
        assert listing.entries, "a page without entries must be the last"
        cookie, verf = listing.entries[-1].cookie, listing.verifier


def test_paging_lists_everything_once(vfs: LocalVfs, export_dir: Path) -> None:
    for i in range(100):
        (export_dir / f"n{i:03d}").write_bytes(b"")
    root = vfs.root_handle()
    for page in (1, 7, 100, 1000):
        names = _all(vfs, root, page)
        assert sorted(names) == sorted(os.fsencode(f"n{i:03d}") for i in range(100))
        assert len(set(names)) == 100


def test_cookies_stay_valid_while_the_directory_changes(vfs: LocalVfs, export_dir: Path) -> None:
    for i in range(40):
        (export_dir / f"f{i}").write_bytes(b"")
    root = vfs.root_handle()
    first = vfs.readdir(ROOT, root, 0, b"", max_entries=20)
    assert not first.eof
    resume = first.entries[-1].cookie
    seen_first = {e.name for e in first.entries}
    # Remove entries already returned, and one not yet returned; add new ones.
    for e in first.entries[:10]:
        vfs.remove(ROOT, root, e.name)
    rest_before = vfs.readdir(ROOT, root, resume, first.verifier, max_entries=1000)
    victim = rest_before.entries[0].name
    vfs.remove(ROOT, root, victim)
    for i in range(10):
        vfs.create_file(ROOT, root, f"new{i}", 0o644)[1].close()
    rest = vfs.readdir(ROOT, root, resume, first.verifier, max_entries=1000)
    assert rest.eof
    rest_names = {e.name for e in rest.entries}
    assert not rest_names & seen_first  # nothing already returned comes back
    assert victim not in rest_names
    expected_old = {e.name for e in rest_before.entries} - {victim}
    assert expected_old <= rest_names  # nothing that survived is skipped
    # New names land wherever their cookie puts them: after the resume point or before it.
    jar_cookie = {e.name: e.cookie for e in vfs.readdir(ROOT, root).entries}
    for name in rest_names:
        assert jar_cookie[name] > resume


def test_cookies_are_stable_across_restarts_and_avoid_reserved_values(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    for i in range(20):
        (export_dir / f"x{i}").write_bytes(b"")
    a = make_vfs(root_squash=False)
    one = a.readdir(ROOT, a.root_handle())
    a.close()
    b = make_vfs(root_squash=False)
    two = b.readdir(ROOT, b.root_handle())
    assert [(e.cookie, e.name) for e in one.entries] == [(e.cookie, e.name) for e in two.entries]
    assert one.verifier == two.verifier and len(one.verifier) == 8
    assert all(3 <= e.cookie < 1 << 63 for e in one.entries)
    cookies = [e.cookie for e in one.entries]
    assert cookies == sorted(cookies)


def test_reserved_cookies_are_refused(vfs: LocalVfs) -> None:
    for c in (1, 2, -1):
        with pytest.raises(BadCookie):
            vfs.readdir(ROOT, vfs.root_handle(), c)


def test_cookie_function_floor() -> None:
    jar = CookieJar(b"s" * 32)
    assert all(jar.cookie(os.urandom(8)) >= 3 for _ in range(1000))


def test_entries_carry_handles_and_attributes(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o750)
    vfs.create(ROOT, root, b"s", FileType.NF4LNK, 0, linkdata=b"/etc")
    entries = {e.name: e for e in vfs.readdir(ROOT, root).entries}
    assert set(entries) == {b"d", b"s"}  # no "." or ".."
    assert entries[b"d"].fh == d
    assert entries[b"d"].attrs == vfs.getattr(d)
    assert entries[b"s"].attrs is not None and entries[b"s"].attrs.type == FileType.NF4LNK
    assert entries[b"s"].error == 0


def test_permissions(make_vfs: MakeVfs, export_dir: Path) -> None:
    (export_dir / "noread").mkdir(mode=0o311)  # search but no read for others
    (export_dir / "nosearch").mkdir(mode=0o744)  # read but no search for others
    (export_dir / "nosearch" / "hidden").write_bytes(b"")
    vfs = make_vfs()
    root = vfs.root_handle()
    nr = vfs.lookup(U1000, root, b"noread")
    with pytest.raises(PermissionError):
        vfs.readdir(U1000, nr)
    with pytest.raises(PermissionError):
        vfs.readdir(ROOT, nr)  # squashed root is "other" too
    ns = vfs.lookup(U1000, root, b"nosearch")
    listing = vfs.readdir(U1000, ns)
    assert [(e.name, e.fh, e.error) for e in listing.entries] == [(b"hidden", None, errno.EACCES)]
    # A cached listing is still subject to the read-permission check.
    vfs.release_identity()
    (export_dir / "owned").mkdir(mode=0o700)
    (export_dir / "owned" / "x").write_bytes(b"")
    os.chown(export_dir / "owned", 1000, 1000)
    os.utime(export_dir / "owned", ns=(0, 1_000_000_000))  # old enough to be cached
    owned = vfs.lookup(U1000, root, b"owned")
    assert [e.name for e in vfs.readdir(U1000, owned).entries] == [b"x"]
    with pytest.raises(PermissionError):
        vfs.readdir(U1001, owned)


def test_listing_cache_sees_every_change(vfs: LocalVfs, export_dir: Path) -> None:
    root = vfs.root_handle()
    for i in range(5):
        (export_dir / f"a{i}").write_bytes(b"")
    os.utime(export_dir, ns=(0, 1_000_000_000))  # an old mtime: the listing gets cached
    assert len(vfs.readdir(ROOT, root).entries) == 5
    vfs.create_file(ROOT, root, b"mine", 0o644)[1].close()
    assert len(vfs.readdir(ROOT, root).entries) == 6
    vfs.release_identity()
    (export_dir / "theirs").write_bytes(b"")  # by another process: moves the mtime
    assert len(vfs.readdir(ROOT, root).entries) == 7
