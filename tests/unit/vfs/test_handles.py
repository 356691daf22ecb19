"""File handles: opaque, authenticated, persistent; forged/foreign → BadHandle, deleted → Stale."""

from __future__ import annotations

import errno
import hmac
import os
import stat
from pathlib import Path

import pytest

from nfsrdma.vfs import NFS4_FHSIZE, BadHandle, Export, FileType, LocalVfs, StaleHandle, handles
from nfsrdma.vfs.handles import MAC_SIZE, MAX_KERNEL_HANDLE, MIN_SIZE, HandleCodec
from nfsrdma.vfs.secret import StateDirError, export_secret

from .conftest import ROOT, MakeVfs, needs_root


def test_codec_round_trip_and_tamper_detection() -> None:
    codec = HandleCodec(b"k" * 32)
    fh = codec.pack(1234, 1, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    assert len(fh) <= NFS4_FHSIZE
    info = codec.unpack(fh)
    assert (info.fileid, info.ktype, info.khandle) == (1234, 1, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    for i in range(len(fh)):
        forged = bytearray(fh)
        forged[i] ^= 0x01
        with pytest.raises(BadHandle):
            codec.unpack(bytes(forged))
    for n in range(len(fh)):
        with pytest.raises(BadHandle):
            codec.unpack(fh[:n])
    with pytest.raises(BadHandle):
        codec.unpack(fh + b"\0")
    with pytest.raises(BadHandle):
        HandleCodec(b"x" * 32).unpack(fh)  # another export's key
    with pytest.raises(BadHandle):
        codec.unpack(b"\0" * NFS4_FHSIZE)
    with pytest.raises(BadHandle):
        codec.unpack(b"\0" * (NFS4_FHSIZE + 1))


def test_the_mac_is_hmac_sha256_of_the_body() -> None:
    """Handles outlive the server (clients keep them across restarts and upgrades): the MAC
    is HMAC-SHA256 under the key derived from the secret, truncated, whatever computes it."""
    secret = bytes(range(32))
    codec = HandleCodec(secret)
    key = hmac.digest(secret, b"nfsrdma file handle v1", "sha256")
    for fileid, khandle in (
        (1, b""),
        (2**64 - 1, b"\xff" * 8),
        (7, bytes(range(MAX_KERNEL_HANDLE))),
    ):
        fh = codec.pack(fileid, 1, khandle)
        body = fh[:-MAC_SIZE]
        assert fh[-MAC_SIZE:] == hmac.digest(key, body, "sha256")[:MAC_SIZE]
        assert codec.unpack(fh).khandle == khandle


def test_handles_made_again_are_the_same_and_the_memory_stays_bounded() -> None:
    """pack remembers the handles it made (a pure function of their body): made again, by
    this codec or a fresh one with the same secret, a handle is the same; another secret
    gives another; at most MADE_MAX are remembered."""
    codec, fresh, other = HandleCodec(b"k" * 32), HandleCodec(b"k" * 32), HandleCodec(b"o" * 32)
    first = [codec.pack(n, 1, n.to_bytes(8, "big")) for n in range(handles.MADE_MAX + 10)]
    assert len(set(first)) == len(first)
    assert len(codec._made) <= handles.MADE_MAX
    again = [codec.pack(n, 1, n.to_bytes(8, "big")) for n in range(handles.MADE_MAX + 10)]
    assert again == first == [fresh.pack(n, 1, n.to_bytes(8, "big")) for n in range(len(first))]
    assert other.pack(5, 1, (5).to_bytes(8, "big")) != first[5]
    assert codec.unpack(again[7]).fileid == 7


def test_codec_refuses_oversized_kernel_handles() -> None:
    codec = HandleCodec(b"k" * 32)
    assert len(codec.pack(1, 1, b"x" * (NFS4_FHSIZE - 14 - MAC_SIZE))) == NFS4_FHSIZE
    with pytest.raises(OSError):
        codec.pack(1, 1, b"x" * (NFS4_FHSIZE - 14 - MAC_SIZE + 1))


@needs_root
@pytest.mark.parametrize("mode", ["kernel", "cache"])
def test_forged_truncated_and_foreign_handles(make_vfs: MakeVfs, tmp_path: Path, mode: str) -> None:
    vfs = make_vfs(root_squash=False, handle_mode=mode)
    root = vfs.root_handle()
    fh, of, _ = vfs.create_file(ROOT, root, b"f", 0o644)
    of.close()
    bad = [
        b"",
        fh[:-1],
        fh[:10],
        fh + b"x",
        bytes(NFS4_FHSIZE),
        os.urandom(len(fh)),
        fh[:-MAC_SIZE] + bytes(MAC_SIZE),
        bytes([fh[0] ^ 0xFF]) + fh[1:],
    ]
    # A genuine handle of another export (other secret) is foreign here.
    other = tmp_path / "other"
    other.mkdir()
    (other / "f").write_bytes(b"secret")
    ovfs = make_vfs(root=str(other), root_squash=False)
    bad.append(ovfs.lookup(ROOT, ovfs.root_handle(), b"f"))
    bad.append(ovfs.root_handle())
    for h in bad:
        with pytest.raises(BadHandle):
            vfs.getattr(h)
        with pytest.raises(BadHandle):
            vfs.lookup(ROOT, h, b"f")
        with pytest.raises(BadHandle):
            vfs.open(ROOT, h, read=True, write=False)
    # A handle is bytes (the wire's decoder makes nothing else): any other type is the
    # caller's error, a TypeError on both builds (the compiled one checks at the call).
    for wrong in ("not bytes", bytearray(vfs.root_handle()), memoryview(vfs.root_handle())):
        with pytest.raises(TypeError):
            vfs.getattr(wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            vfs.lookup(ROOT, wrong, b"f")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            vfs.open(ROOT, wrong, read=True, write=False)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            vfs.create(ROOT, wrong, b"new", FileType.NF4DIR, 0o755)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        vfs.lookup(ROOT, root, b"new")  # nothing was made


@needs_root
def test_handle_of_a_file_outside_the_export_cannot_be_made(
    make_vfs: MakeVfs, tmp_path: Path
) -> None:
    """A handle naming a file beside the export (same file system, so open_by_handle_at could
    reach it) cannot be made without the export secret: the MAC covers the kernel handle."""
    vfs = make_vfs(root_squash=False)
    secret = tmp_path / "outside"
    secret.write_bytes(b"not exported")
    from nfsrdma.vfs import syscalls

    fd = os.open(secret, os.O_PATH)
    try:
        ktype, kh, _ = syscalls.fd_handle(fd)
    except OSError:
        pytest.skip("no kernel file handles on this file system")
    finally:
        os.close(fd)
    fh = vfs.root_handle()
    body = fh[:1] + secret.stat().st_ino.to_bytes(8, "big")
    body += ktype.to_bytes(4, "big", signed=True) + bytes([len(kh)]) + kh
    for mac in (fh[-MAC_SIZE:], bytes(MAC_SIZE), os.urandom(MAC_SIZE)):
        with pytest.raises(BadHandle):
            vfs.getattr(body + mac)


@needs_root
@pytest.mark.parametrize("mode", ["kernel", "cache"])
def test_handles_of_deleted_objects_are_stale(make_vfs: MakeVfs, mode: str) -> None:
    vfs = make_vfs(root_squash=False, handle_mode=mode)
    root = vfs.root_handle()
    fh, of, _ = vfs.create_file(ROOT, root, b"f", 0o644)
    of.close()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    vfs.remove(ROOT, root, b"f")
    vfs.remove(ROOT, root, b"d")
    for h in (fh, d):
        with pytest.raises(StaleHandle):
            vfs.getattr(h)
    with pytest.raises(StaleHandle):
        vfs.lookup(ROOT, d, b"x")
    with pytest.raises(StaleHandle):
        vfs.open(ROOT, fh, read=True, write=False)


@needs_root
def test_deleted_behind_the_servers_back_is_stale(make_vfs: MakeVfs, export_dir: Path) -> None:
    """Removal by another process, with the descriptor still cached and after eviction."""
    vfs = make_vfs(root_squash=False, fd_cache_size=1)
    root = vfs.root_handle()
    (export_dir / "a").write_bytes(b"a")
    (export_dir / "b").write_bytes(b"b")
    fa = vfs.lookup(ROOT, root, b"a")
    (export_dir / "a").unlink()
    with pytest.raises(StaleHandle):
        vfs.getattr(fa)  # cached O_PATH descriptor: nlink == 0
    fb = vfs.lookup(ROOT, root, b"b")
    vfs.lookup(ROOT, root, b"b")
    (export_dir / "b").unlink()
    (export_dir / "c").write_bytes(b"c")
    vfs.lookup(ROOT, root, b"c")  # evicts b (capacity 1)
    with pytest.raises(StaleHandle):
        vfs.getattr(fb)  # open_by_handle_at: ESTALE


@needs_root
def test_handles_survive_a_restart_in_kernel_mode(make_vfs: MakeVfs) -> None:
    vfs = make_vfs(root_squash=False)
    assert vfs.kernel_handles
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    fh, of, _ = vfs.create_file(ROOT, d, b"f", 0o644)
    of.write(0, b"persist")
    of.close()
    vfs.close()
    again = make_vfs(root_squash=False)
    assert again.root_handle() == root
    assert again.getattr(fh).size == 7
    assert again.anonymous_read(ROOT, fh, 0, 100) == (b"persist", True)
    assert again.lookupp(ROOT, d) == root
    assert again.lookup(ROOT, d, b"f") == fh


@needs_root
def test_cache_mode_handles_go_stale_on_restart_but_root_survives(make_vfs: MakeVfs) -> None:
    vfs = make_vfs(root_squash=False, handle_mode="cache")
    root = vfs.root_handle()
    fh, of, _ = vfs.create_file(ROOT, root, b"f", 0o644)
    of.close()
    again = make_vfs(root_squash=False, handle_mode="cache")
    assert again.root_handle() == root
    with pytest.raises(StaleHandle):
        again.getattr(fh)
    assert again.lookup(ROOT, root, b"f") == fh  # same object, same handle
    assert again.getattr(fh).type == FileType.NF4REG


@needs_root
def test_same_object_same_handle_and_size_limit(vfs: LocalVfs) -> None:
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    assert vfs.lookup(ROOT, root, b"d") == d
    assert [e.fh for e in vfs.readdir(ROOT, root).entries] == [d]
    assert len(d) <= NFS4_FHSIZE and len(root) <= NFS4_FHSIZE


@needs_root
def test_secret_is_persisted_outside_the_export_with_mode_0600(
    make_vfs: MakeVfs, export_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    make_vfs()
    files = list(state_dir.iterdir())
    assert len(files) == 1
    st = files[0].stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert not any(export_dir.iterdir())
    # The same export reuses its secret; another export gets its own file.
    make_vfs()
    assert len(list(state_dir.iterdir())) == 1
    other = tmp_path / "other"
    other.mkdir()
    make_vfs(root=str(other))
    assert len(list(state_dir.iterdir())) == 2
    # A state directory inside the export is refused.
    with pytest.raises(StateDirError, match="outside the export"):
        make_vfs(state_dir=str(export_dir / "state"))
    # A secret readable by others is refused.
    files[0].chmod(0o644)
    with pytest.raises(StateDirError, match="0600") as ei:
        make_vfs()
    assert ei.value.errno == errno.EPERM and ei.value.state_dir == str(state_dir)
    # So are a damaged secret and a state directory that cannot be made.
    files[0].chmod(0o600)
    files[0].write_text("{}")
    with pytest.raises(StateDirError, match="no secret"):
        make_vfs()
    with pytest.raises(StateDirError) as ei:
        make_vfs(state_dir=str(files[0] / "below-a-file"))
    assert ei.value.errno == errno.ENOTDIR


def test_default_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from nfsrdma.vfs.secret import default_state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir(euid=1000) == str(tmp_path / "xdg" / "nfsrdma")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir(euid=1000) == str(tmp_path / "home" / ".local" / "state" / "nfsrdma")


def test_default_state_dir_of_root_is_var_lib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root's home may be read-only: root keeps its secrets in /var/lib/nfsrdma (FHS), as knfsd
    keeps its state in /var/lib/nfs, whatever HOME and XDG_STATE_HOME say."""
    from nfsrdma.vfs.secret import default_state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir(euid=0) == "/var/lib/nfsrdma"
    if os.geteuid() == 0:
        assert default_state_dir() == "/var/lib/nfsrdma"
    else:
        assert default_state_dir() == str(tmp_path / "xdg" / "nfsrdma")


def test_secret_race_yields_one_secret(tmp_path: Path) -> None:
    root = tmp_path / "e"
    root.mkdir()
    st = os.stat(root)
    a = export_secret(str(root), st, str(tmp_path / "s"))
    b = export_secret(str(root), st, str(tmp_path / "s"))
    assert a == b and len(a) == 32
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.endswith(".tmp")]


@needs_root
def test_export_options_are_plain_values(export_dir: Path, state_dir: Path) -> None:
    e = Export(str(export_dir), state_dir=str(state_dir))
    assert (e.read_only, e.root_squash, e.anon_uid, e.anon_gid) == (False, True, 65534, 65534)
    assert e.anonymous_cred().uid == 65534
    v = LocalVfs(e)
    try:
        assert len(v.write_verifier) == 8
        w = LocalVfs(e)
        assert w.write_verifier != v.write_verifier  # per server instance
        w.close()
    finally:
        v.release_identity()
        v.close()


@needs_root
def test_cache_mode_resolves_handles_from_every_source(make_vfs: MakeVfs) -> None:
    """Handles from LOOKUP, READDIR, CREATE, OPEN-create and LOOKUPP stay resolvable after
    eviction from a 1-entry descriptor cache."""
    vfs = make_vfs(root_squash=False, handle_mode="cache", fd_cache_size=1)
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    sub = vfs.create(ROOT, d, b"sub", FileType.NF4DIR, 0o755)
    f, of, _ = vfs.create_file(ROOT, sub, b"f", 0o644)
    of.close()
    vfs.create(ROOT, root, b"other", FileType.NF4DIR, 0o755)
    from_readdir = {e.name: e.fh for e in vfs.readdir(ROOT, sub).entries}
    for h, kind in ((d, FileType.NF4DIR), (sub, FileType.NF4DIR), (f, FileType.NF4REG)):
        vfs.lookup(ROOT, root, b"other")  # evict
        assert vfs.getattr(h).type == kind
    assert from_readdir[b"f"] == f
    assert vfs.lookupp(ROOT, sub) == d


@needs_root
def test_file_system_without_kernel_handles(
    make_vfs: MakeVfs, export_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some file systems (overlayfs, 9p, FUSE) have no name_to_handle_at: handles then carry
    only the fileid, resolve from memory, and statx mount IDs still keep other mounts out."""
    from nfsrdma.vfs import syscalls

    fd = os.open(export_dir, os.O_PATH)
    try:
        assert syscalls.mount_id(fd) == syscalls.fd_handle(fd)[2]
    except OSError:
        pass  # the test directory itself has no handles: nothing to compare
    finally:
        os.close(fd)

    def unsupported(fd: int) -> tuple[int, bytes, int]:
        raise OSError(errno.EOPNOTSUPP, "no handles here")

    monkeypatch.setattr(syscalls, "fd_handle", unsupported)
    vfs = make_vfs(root_squash=False, fd_cache_size=1)
    assert not vfs.kernel_handles
    root = vfs.root_handle()
    d = vfs.create(ROOT, root, b"d", FileType.NF4DIR, 0o755)
    f, of, _ = vfs.create_file(ROOT, d, b"f", 0o644)
    of.close()
    vfs.lookup(ROOT, root, b"d")  # evict f
    assert vfs.getattr(f).type == FileType.NF4REG
    assert len(f) == MIN_SIZE
    vfs.remove(ROOT, d, b"f")
    with pytest.raises(StaleHandle):
        vfs.getattr(f)


def test_fd_handle_is_name_to_handle_at_of_the_descriptor_in_every_thread(
    export_dir: Path,
) -> None:
    """``fd_handle`` reuses its calling thread's buffers: the same answer as a call with its
    own, for objects whose handles differ in length and type, in any thread; errors raise."""
    import threading

    from nfsrdma.vfs import syscalls

    (export_dir / "f").write_bytes(b"x")
    (export_dir / "d").mkdir()
    fds = [os.open(export_dir / n, os.O_PATH) for n in ("f", "d")]
    fds.append(os.open(export_dir, os.O_PATH))
    try:
        try:
            want = [syscalls.name_to_handle_at(fd, b"", syscalls.AT_EMPTY_PATH) for fd in fds]
        except OSError:
            pytest.skip("no kernel file handles on the test file system")
        got: list[list[tuple[int, bytes, int]]] = []

        def run() -> None:
            got.append([syscalls.fd_handle(fd) for fd in reversed(fds)][::-1])

        run()
        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [want] * 5
        with pytest.raises(OSError) as e:
            syscalls.fd_handle(-1)
        assert e.value.errno == errno.EBADF
    finally:
        for fd in fds:
            os.close(fd)
