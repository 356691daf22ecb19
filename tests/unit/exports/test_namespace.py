"""The pseudo-root over several exports (``vfs/namespace.py``), called directly: what each
client sees, per-export squash and ro, handles refused by the wrong export, reload."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.vfs.base import (
    ACCESS4_ALL,
    ACCESS4_MODIFY,
    BadHandle,
    Cred,
    FileType,
    Origin,
    StaleHandle,
    WrongSecurity,
)
from nfsrdma.vfs.exports import AUTH_NONE, AUTH_SYS, RPCSEC_GSS_KRB5P, ExportsError, parse
from nfsrdma.vfs.namespace import PSEUDO_FSID, NamespaceVfs, pseudo_fileid


def who(
    address: str, uid: int = 1000, gid: int = 1000, flavor: int = AUTH_SYS, port: int = 700
) -> Cred:
    return Cred(uid, gid, (), Origin(f"{address}:{port}", flavor))


A = who("127.0.0.1")
B = who("127.0.0.2")
NOBODY = who("127.0.0.9")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for d in ("srv/pub", "srv/team", "home/ann"):
        (tmp_path / d).mkdir(parents=True)
        os.chmod(tmp_path / d, 0o777)
    return tmp_path


def table_text(root: Path, extra: str = "") -> str:
    return (
        f"{root}/srv/pub  *(ro,insecure,sec=sys:none)\n"
        f"{root}/srv/team 127.0.0.1(rw,insecure,no_root_squash) 127.0.0.2(ro,insecure)\n"
        f"{root}/home/ann 127.0.0.2(rw,insecure,all_squash,anonuid=4242,anongid=4343,"
        f"sec=krb5p:sys)\n" + extra
    )


@pytest.fixture
def ns(tree: Path) -> Iterator[NamespaceVfs]:
    vfs = NamespaceVfs(parse(table_text(tree)), state_dir=str(tree / "state"))
    try:
        yield vfs
    finally:
        vfs.release_identity()
        vfs.close()


def mkfile(ns: NamespaceVfs, cred: Cred, dir_fh: bytes, name: str) -> bytes:
    fh, f, _ = ns.create_file(cred, dir_fh, name, 0o644)
    f.close()
    return fh


def walk(ns: NamespaceVfs, cred: Cred, path: Path) -> bytes:
    fh = ns.root_handle()
    for part in path.parts[1:]:
        fh = ns.lookup(cred, fh, part)
    return fh


def names(ns: NamespaceVfs, cred: Cred, fh: bytes) -> list[bytes]:
    return sorted(e.name for e in ns.readdir(cred, fh).entries)


def test_pseudo_tree_shows_only_what_the_client_may_see(ns: NamespaceVfs, tree: Path) -> None:
    top = tree.parts[1]
    root = ns.root_handle()
    assert names(ns, A, root) == [top.encode()]
    srv_a = walk(ns, A, tree / "srv")
    assert names(ns, A, srv_a) == [b"pub", b"team"]
    parent = walk(ns, A, tree)
    assert names(ns, A, parent) == [b"srv"]  # /home only leads to an export A has no rule for
    assert names(ns, B, parent) == [b"home", b"srv"]
    # No rule at all (but '*' of /srv/pub): only the path to /srv/pub.
    assert names(ns, NOBODY, parent) == [b"srv"]
    assert names(ns, NOBODY, walk(ns, NOBODY, tree / "srv")) == [b"pub"]
    # LOOKUP of a name that leads only where the client may not go: NFS4ERR_ACCESS.
    with pytest.raises(PermissionError):
        ns.lookup(A, parent, "home")
    with pytest.raises(PermissionError):
        ns.lookup(NOBODY, walk(ns, NOBODY, tree / "srv"), "team")
    with pytest.raises(FileNotFoundError):
        ns.lookup(A, parent, "nothing")
    # The server itself (no origin) sees everything.
    assert names(ns, Cred(0, 0), parent) == [b"home", b"srv"]


def test_a_client_outside_every_rule_sees_an_empty_pseudo_root(tree: Path) -> None:
    vfs = NamespaceVfs(
        parse(f"{tree}/srv/team 127.0.0.1(rw,insecure)\n"), state_dir=str(tree / "state")
    )
    try:
        assert names(vfs, NOBODY, vfs.root_handle()) == []
        with pytest.raises(PermissionError):
            vfs.lookup(NOBODY, vfs.root_handle(), tree.parts[1])
        assert names(vfs, A, vfs.root_handle()) == [tree.parts[1].encode()]
    finally:
        vfs.close()


def test_attributes_fsid_and_crossing(ns: NamespaceVfs, tree: Path) -> None:
    root = ns.getattr(ns.root_handle())
    assert root.type == FileType.NF4DIR and root.fsid == (PSEUDO_FSID, 0)
    srv = walk(ns, A, tree / "srv")
    team = ns.lookup(A, srv, "team")
    pub = ns.lookup(A, srv, "pub")
    t, p = ns.getattr(team), ns.getattr(pub)
    table = ns.table.by_path()
    assert t.fsid == (table[f"{tree}/srv/team"].fsid, 0)
    assert p.fsid == (table[f"{tree}/srv/pub"].fsid, 0)
    assert t.fsid != p.fsid != root.fsid
    # The export root covers the pseudo directory of its path.
    assert t.mounted_on_fileid == pseudo_fileid(f"{tree}/srv/team") != t.fileid
    assert t.fileid == os.stat(tree / "srv/team").st_ino
    # READDIR of the pseudo directory gives the export roots' attributes.
    by_name = {e.name: e for e in ns.readdir(A, srv).entries}
    assert by_name[b"team"].fh == team and by_name[b"team"].attrs == t
    # LOOKUPP from an export root goes back into the pseudo fs.
    assert ns.lookupp(A, team) == srv
    assert ns.lookupp(A, srv) == walk(ns, A, tree)
    with pytest.raises(FileNotFoundError):
        ns.lookupp(A, ns.root_handle())
    # Inside the export, fsid stays the export's.
    f = mkfile(ns, A, team, "f")
    assert ns.getattr(f).fsid == t.fsid
    assert ns.getattr(f).mounted_on_fileid == ns.getattr(f).fileid
    d = ns.create(A, team, "d", FileType.NF4DIR, 0o755)
    assert ns.getattr(d).fsid == t.fsid
    assert ns.lookupp(A, d) == team


def test_per_export_read_only_and_squash(ns: NamespaceVfs, tree: Path) -> None:
    root_a = who("127.0.0.1", 0, 0)
    team = walk(ns, root_a, tree / "srv/team")
    # A: rw, no_root_squash: root creates a root-owned file.
    fh = mkfile(ns, root_a, team, "byroot")
    ns.release_identity()
    st = os.stat(tree / "srv/team/byroot")
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert ns.access(root_a, fh, ACCESS4_ALL) & ACCESS4_MODIFY
    # B: ro on the same export: every modification is EROFS, ACCESS grants no modify.
    team_b = walk(ns, B, tree / "srv/team")
    assert team_b == team
    with pytest.raises(OSError) as e:
        mkfile(ns, B, team, "x")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        ns.open(B, fh, read=True, write=True)
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        ns.remove(B, team, "byroot")
    assert e.value.errno == errno.EROFS
    assert not ns.access(B, fh, ACCESS4_ALL) & ACCESS4_MODIFY
    ns.open(B, fh, read=True, write=False).close()
    # B on /home/ann: all_squash to anonuid/anongid.
    ann = walk(ns, B, tree / "home/ann")
    mkfile(ns, B, ann, "squashed")
    ns.release_identity()  # this thread acted as the client last
    st = os.stat(tree / "home/ann/squashed")
    assert (st.st_uid, st.st_gid) == (4242, 4343)
    # root_squash (the default) on /srv/pub for root of another client: read-only anyway,
    # and files it reads are read as nobody; AUTH_NONE maps to the anonymous identity.
    pub = walk(ns, who("127.0.0.5", 0, 0), tree / "srv/pub")
    with pytest.raises(OSError) as e:
        ns.create(who("127.0.0.5", 0, 0), pub, "x", FileType.NF4REG, 0o644)
    assert e.value.errno == errno.EROFS
    walk(ns, who("127.0.0.5", flavor=AUTH_NONE), tree / "srv/pub")


def test_flavours_and_wrongsec(ns: NamespaceVfs, tree: Path) -> None:
    home = walk(ns, B, tree / "home")
    none_b = who("127.0.0.2", flavor=AUTH_NONE)
    # B may reach /home/ann by address, but not with AUTH_NONE: NFS4ERR_WRONGSEC.
    with pytest.raises(WrongSecurity):
        ns.lookup(none_b, home, "ann")
    # SECINFO answers with the export's flavours in the order written, whatever the flavour
    # of the asking credential.
    assert ns.flavors(none_b, home, b"ann") == (RPCSEC_GSS_KRB5P, AUTH_SYS)
    ann = ns.lookup(B, home, "ann")
    assert ns.flavors(none_b, ann) == (RPCSEC_GSS_KRB5P, AUTH_SYS)
    # PUTFH does not refuse a wrong flavour (the next operation does); the address it does.
    ns.admit(none_b, ann)
    with pytest.raises(PermissionError):
        ns.admit(A, ann)
    with pytest.raises(WrongSecurity):
        ns.readdir(none_b, ann)
    pub = walk(ns, none_b, tree / "srv/pub")
    assert ns.flavors(none_b, pub) == (AUTH_SYS, AUTH_NONE)
    with pytest.raises(PermissionError):
        ns.flavors(A, walk(ns, A, tree), b"home")


def test_secure_needs_a_privileged_source_port(tree: Path) -> None:
    vfs = NamespaceVfs(parse(f"{tree}/srv/team 127.0.0.1(rw)\n"), state_dir=str(tree / "state"))
    try:
        top = vfs.lookup(who("127.0.0.1", port=1023), vfs.root_handle(), tree.parts[1])
        with pytest.raises(PermissionError):
            walk(vfs, who("127.0.0.1", port=40000), tree / "srv/team")
        assert top
        walk(vfs, who("127.0.0.1", port=1023), tree / "srv/team")
        # Over RPC-over-RDMA every source counts as secure (knfsd does the same).
        rdma = Cred(1000, 1000, (), Origin("127.0.0.1:40000", AUTH_SYS, "rdma"))
        walk(vfs, rdma, tree / "srv/team")
    finally:
        vfs.close()


def test_handles_are_refused_by_the_wrong_export(ns: NamespaceVfs, tree: Path) -> None:
    team = walk(ns, A, tree / "srv/team")
    pub = walk(ns, A, tree / "srv/pub")
    ns.check(team)
    # Put the other export's fsid in front of a handle: its own secret does not authenticate.
    forged = pub[:4] + team[4:]
    with pytest.raises(BadHandle):
        ns.check(forged)
    with pytest.raises(BadHandle):
        ns.getattr(forged)
    # An fsid that is not exported: stale.
    with pytest.raises(StaleHandle):
        ns.check(b"\x7f\xff\xff\xfe" + team[4:])
    with pytest.raises(BadHandle):
        ns.check(b"\0\0\0\0" + b"x" * 5)
    with pytest.raises(StaleHandle):
        ns.check(b"\0\0\0\0" + b"x" * 16)
    with pytest.raises(BadHandle):
        ns.check(b"abc")
    # Rename and link across exports: EXDEV.
    f = mkfile(ns, A, team, "f")
    with pytest.raises(OSError) as e:
        ns.link(Cred(0, 0), f, pub, "f")
    assert e.value.errno == errno.EXDEV


def test_reload_applies_to_the_next_call_and_keeps_handles(ns: NamespaceVfs, tree: Path) -> None:
    team = walk(ns, A, tree / "srv/team")
    f = mkfile(ns, A, team, "f")
    opened = ns.open(A, f, read=True, write=True)
    ann = walk(ns, B, tree / "home/ann")
    # /srv/team now for 127.0.0.2 only, read-write; /home/ann gone.
    ns.reload(parse(f"{tree}/srv/pub *(ro,insecure)\n{tree}/srv/team 127.0.0.2(rw,insecure)\n"))
    with pytest.raises(PermissionError):
        ns.getattr(team) and ns.admit(A, team)
    ns.admit(B, team)  # same handle, same export
    mkfile(ns, B, team, "g")
    with pytest.raises(StaleHandle):
        ns.check(ann)
    assert names(ns, B, walk(ns, B, tree)) == [b"srv"]
    # A file opened before the reload keeps working.
    assert opened.write(0, b"still here") == 10
    opened.close()


def test_failed_reload_keeps_the_rules(ns: NamespaceVfs, tree: Path) -> None:
    before = ns.table
    with pytest.raises(FileNotFoundError):
        ns.reload(parse(f"{tree}/srv/pub *(rw)\n{tree}/nothere *(rw)\n"))
    assert ns.table is before
    walk(ns, A, tree / "srv/team")
    with pytest.raises(ExportsError):
        parse("/x *(rw,bad)\n")


def test_nfs42_calls_reach_the_export(ns: NamespaceVfs, tree: Path) -> None:
    """SEEK, ALLOCATE/DEALLOCATE, READ_PLUS segments, COPY and extended attributes go through
    the pseudo-root to the export's own file system, with the rule's identity and ro."""
    team = walk(ns, A, tree / "srv/team")
    src_fh, src, _ = ns.create_file(A, team, "src", 0o644)
    dst_fh, dst, _ = ns.create_file(A, team, "dst", 0o644)
    try:
        src.write(0, b"a" * 4096)
        src.allocate(4096, 8192)
        assert src.getattr().size == 4096 + 8192
        src.deallocate(0, 4096)
        assert src.seek(0, data=False) == 0  # a hole where the data was punched out
        segments, eof = src.read_segments(0, 16384)
        assert eof and sum(s.length for s in segments) == 4096 + 8192
        src.write(0, b"copied")
        assert src.copy_to(dst, 0, 0, 6) == 6
        assert dst.read(0, 6) == (b"copied", True)
    finally:
        src.close()
        dst.close()
    try:
        ns.setxattr(A, src_fh, b"colour", b"blue")
    except OSError as e:  # the host file system keeps no user. attributes
        assert e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP)
    else:
        assert ns.getxattr(A, src_fh, b"colour") == b"blue"
        assert ns.listxattr(A, src_fh) == [b"colour"]
        with pytest.raises(OSError) as ei:  # 127.0.0.2 has the export read-only
            ns.removexattr(B, src_fh, b"colour")
        assert ei.value.errno == errno.EROFS
        ns.removexattr(A, src_fh, b"colour")
        assert ns.listxattr(A, src_fh) == []
    assert dst_fh != src_fh
