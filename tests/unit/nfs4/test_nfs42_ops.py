"""NFSv4.2 through the real COMPOUND path (RFC 7862, RFC 8276): minor version 2 beside 1, SEEK,
READ_PLUS, ALLOCATE, DEALLOCATE, COPY (synchronous), OFFLOAD_*, CLONE, the extended-attribute
operations and ACCESS's xattr bits, each with its errors; bad input changes nothing.

The export is on the host's file system (ext4 under tmp_path: holes, fallocate and user
extended attributes work; FICLONERANGE does not, so CLONE's answer there is NFS4ERR_NOTSUPP).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4.attrs import attr_numbers, bitmap_of
from nfsrdma.nfs4.context import ANONYMOUS_STATEID
from nfsrdma.xdr.gen import nfs4

from ..session.helpers import op, op_sequence
from ..session.test_ops_compound import USER_CRED
from .test_courtesy import open_file, putfh
from .test_io_ops import READ
from .wire import Client, Clock, build, close, install_clock, status_list

OK = nfs4.NFS4_OK
ROOT = op(nfs4.OP_PUTROOTFH)
SAVE = op(nfs4.OP_SAVEFH)
BLOCK = 4096
D2 = 256 << 10  # where the second data block is
SIZE = 512 << 10  # sparse_file's size


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return install_clock(monkeypatch)


def export_of(tmp_path: Path) -> Path:
    return tmp_path / "export"


def write(sid: nfs4.stateid4, offset: int, data: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_WRITE, nfs4.WRITE4args(sid, offset, nfs4.FILE_SYNC4, data))


def seek(sid: nfs4.stateid4, offset: int, what: int) -> nfs4.nfs_argop4:
    return op(nfs4.OP_SEEK, nfs4.SEEK4args(sid, offset, nfs4.data_content4(what)))


def copy(
    src: nfs4.stateid4,
    dst: nfs4.stateid4,
    soff: int,
    doff: int,
    count: int,
    servers: list[nfs4.netloc4] | None = None,
) -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_COPY,
        nfs4.COPY4args(src, dst, soff, doff, count, False, True, servers or []),
    )


def getattr_op(*numbers: int) -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETATTR, nfs4.GETATTR4args(bitmap_of(list(numbers))))


async def sparse_file(c: Client, tmp_path: Path, name: bytes) -> tuple[bytes, nfs4.stateid4]:
    """data [0, 4K), a hole [4K, D2), data [D2, D2+4K), a hole to SIZE."""
    fh, sid = await open_file(c, name)
    path = export_of(tmp_path) / name.decode()
    with open(path, "r+b") as f:
        f.write(b"A" * BLOCK)
        f.seek(D2)
        f.write(b"B" * BLOCK)
        f.truncate(SIZE)
    return fh, sid


async def v42(tmp_path: Path, owner: bytes = b"client-42") -> tuple[Any, Client]:
    srv = build(tmp_path)
    return srv, await Client(srv, owner, minor=2).mount()


# ---------------------------------------------------------------- minor versions


async def test_minor_version_2_runs_beside_1_and_decides_what_exists(
    tmp_path: Path, clock: Clock
) -> None:
    srv = build(tmp_path)
    try:
        c41 = await Client(srv, b"client-41").mount()
        c42 = await Client(srv, b"client-42", minor=2).mount()  # EXCHANGE_ID .. in 4.2
        fh, sid = await open_file(c41, b"f")
        await c41.expect(OK, putfh(fh), write(sid, 0, b"hello"))
        # A 4.2 operation in a 4.1 COMPOUND is not an operation at all.
        res = await c41.call(putfh(fh), seek(sid, 0, nfs4.NFS4_CONTENT_DATA))
        assert res.status == nfs4.NFS4ERR_OP_ILLEGAL, status_list(res)
        assert res.resarray[-1].resop == nfs4.OP_ILLEGAL
        # 4.1's supported_attrs has none of 4.2's attributes, and asking for them gets nothing.
        attrs42 = [nfs4.FATTR4_CLONE_BLKSIZE, nfs4.FATTR4_XATTR_SUPPORT]
        res = await c41.expect(OK, putfh(fh), getattr_op(nfs4.FATTR4_SUPPORTED_ATTRS, *attrs42))
        fattr = c41.value(res, 2).obj_attributes
        assert attr_numbers(fattr.attrmask) == [nfs4.FATTR4_SUPPORTED_ATTRS]
        supported41 = attr_numbers(nfs4.dec_bitmap4(_reader(fattr.attr_vals), 0)[0])
        assert nfs4.FATTR4_SUPPATTR_EXCLCREAT in supported41
        assert not {77, 78, 79, 82} & set(supported41)
        # The same in 4.2: all there.
        asked = [
            nfs4.FATTR4_SUPPORTED_ATTRS,
            nfs4.FATTR4_CLONE_BLKSIZE,
            nfs4.FATTR4_SPACE_FREED,
            nfs4.FATTR4_CHANGE_ATTR_TYPE,
            nfs4.FATTR4_XATTR_SUPPORT,
        ]
        res = await c42.expect(OK, putfh(fh), getattr_op(*asked))
        fattr = c42.value(res, 2).obj_attributes
        assert attr_numbers(fattr.attrmask) == asked
        supported42, off = nfs4.dec_bitmap4(_reader(fattr.attr_vals), 0)
        assert {77, 78, 79, 82} <= set(attr_numbers(supported42))
        tail = bytes(fattr.attr_vals[off:])
        assert int.from_bytes(tail[0:4], "big") == BLOCK  # clone_blksize
        assert int.from_bytes(tail[12:16], "big") == nfs4.NFS4_CHANGE_TYPE_IS_UNDEFINED
        assert int.from_bytes(tail[16:20], "big") == 1  # xattr_support
        # VERIFY and SETATTR of a 4.2 attribute in 4.1: it does not exist there.
        xs = nfs4.fattr4(bitmap_of([nfs4.FATTR4_XATTR_SUPPORT]), (1).to_bytes(4, "big"))
        await c41.expect(
            nfs4.NFS4ERR_ATTRNOTSUPP, putfh(fh), op(nfs4.OP_VERIFY, nfs4.VERIFY4args(xs))
        )
        await c42.expect(OK, putfh(fh), op(nfs4.OP_VERIFY, nfs4.VERIFY4args(xs)))
        await c41.expect(
            nfs4.NFS4ERR_ATTRNOTSUPP, putfh(fh), op(nfs4.OP_SETATTR, nfs4.SETATTR4args(sid, xs))
        )
        # The 4.2 client's SEEK works; the 4.1 client's session is unaffected.
        _, sid42 = await open_file(c42, b"f")
        await c42.expect(OK, putfh(fh), seek(sid42, 0, nfs4.NFS4_CONTENT_DATA))
        await c41.expect(OK, putfh(fh), op(nfs4.OP_READ, nfs4.READ4args(sid, 0, 5)))
        # A minor version nobody serves.
        res, _ = await srv.call(c42.conn, [ROOT], minor=3)
        assert res.status == nfs4.NFS4ERR_MINOR_VERS_MISMATCH and not res.resarray
    finally:
        close(srv)


def _reader(data: Any) -> Any:
    from nfsrdma.xdr.runtime import Reader

    return Reader(bytes(data))


async def test_access_answers_the_xattr_bits_in_4_2_only(tmp_path: Path, clock: Clock) -> None:
    srv = build(tmp_path)
    try:
        c41 = await Client(srv, b"client-41").mount()
        c42 = await Client(srv, b"client-42", minor=2).mount()
        fh, _ = await open_file(c42, b"f")
        xa = nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XAWRITE | nfs4.ACCESS4_XALIST
        res = await c42.expect(OK, putfh(fh), op(nfs4.OP_ACCESS, nfs4.ACCESS4args(xa | 1)))
        ok = c42.value(res, 2)
        assert ok.supported == xa | 1 and ok.access == xa | 1
        await c41.expect(nfs4.NFS4ERR_INVAL, putfh(fh), op(nfs4.OP_ACCESS, nfs4.ACCESS4args(xa)))
        # Another user on a 0644 file of root's: may read and list, not write.
        os.chmod(export_of(tmp_path) / "f", 0o644)
        seq = op_sequence(c42.sessionid, c42.seqid)
        c42.seqid += 1
        ask = op(nfs4.OP_ACCESS, nfs4.ACCESS4args(xa))
        res, _ = await srv.call(c42.conn, [seq, putfh(fh), ask], USER_CRED, minor=2)
        assert res.status == OK, status_list(res)
        got = c42.value(res, 2)
        assert got.access == nfs4.ACCESS4_XAREAD | nfs4.ACCESS4_XALIST
        srv.state.vfs.release_identity()
    finally:
        close(srv)


# ---------------------------------------------------------------- sparse files


async def test_seek_finds_data_and_holes_as_lseek_does(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        fh, sid = await sparse_file(c, tmp_path, b"sparse")
        data, hole = nfs4.NFS4_CONTENT_DATA, nfs4.NFS4_CONTENT_HOLE

        async def found(offset: int, what: int) -> tuple[bool, int]:
            res = await c.expect(OK, putfh(fh), seek(sid, offset, what))
            r = c.value(res, 2)
            return r.sr_eof, r.sr_offset

        assert await found(0, data) == (False, 0)
        assert await found(0, hole) == (False, BLOCK)
        assert await found(BLOCK, data) == (False, D2)
        assert await found(D2 + 1, hole) == (False, D2 + BLOCK)
        # No data after the last block: NFS4_OK and eof (the size as offset).
        assert await found(D2 + BLOCK, data) == (True, SIZE)
        # At or past the end of file: NFS4ERR_NXIO.
        await c.expect(nfs4.NFS4ERR_NXIO, putfh(fh), seek(sid, SIZE, hole))
        await c.expect(nfs4.NFS4ERR_NXIO, putfh(fh), seek(sid, SIZE + 1, data))
    finally:
        close(srv)


async def test_read_plus_returns_holes_as_hole_segments(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        fh, sid = await sparse_file(c, tmp_path, b"sparse")
        rp = op(nfs4.OP_READ_PLUS, nfs4.READ_PLUS4args(sid, 0, D2 + 2 * BLOCK))
        seq = op_sequence(c.sessionid, c.seqid, cachethis=False)  # 8 KiB of data: not cached
        c.seqid += 1
        res, _ = await srv.call(c.conn, [seq, putfh(fh), rp], minor=2)
        assert res.status == OK, status_list(res)
        body = c.value(res, 2)
        kinds = [(s.rpc_content, s.value) for s in body.rpr_contents]
        assert kinds[0] == (nfs4.NFS4_CONTENT_DATA, nfs4.data4(0, b"A" * BLOCK))
        assert kinds[1] == (nfs4.NFS4_CONTENT_HOLE, nfs4.data_info4(BLOCK, D2 - BLOCK))
        assert kinds[2] == (nfs4.NFS4_CONTENT_DATA, nfs4.data4(D2, b"B" * BLOCK))
        assert kinds[3] == (nfs4.NFS4_CONTENT_HOLE, nfs4.data_info4(D2 + BLOCK, BLOCK))
        assert len(kinds) == 4 and not body.rpr_eof
        # Reassembled, the segments are the file's bytes.
        expect = (export_of(tmp_path) / "sparse").read_bytes()[: D2 + 2 * BLOCK]
        got = bytearray(len(expect))
        for kind, v in kinds:
            if kind == nfs4.NFS4_CONTENT_DATA:
                got[v.d_offset : v.d_offset + len(v.d_data)] = v.d_data
        assert bytes(got) == expect
        # The tail, to the end: eof.
        rp = op(nfs4.OP_READ_PLUS, nfs4.READ_PLUS4args(sid, SIZE - 10, 100))
        res = await c.expect(OK, putfh(fh), rp)
        body = c.value(res, 2)
        assert body.rpr_eof
        assert [s.value for s in body.rpr_contents] == [nfs4.data_info4(SIZE - 10, 10)]
        rp = op(nfs4.OP_READ_PLUS, nfs4.READ_PLUS4args(sid, SIZE + 1, 100))
        res = await c.expect(OK, putfh(fh), rp)
        assert c.value(res, 2).rpr_eof and not c.value(res, 2).rpr_contents
    finally:
        close(srv)


async def test_allocate_and_deallocate(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        fh, sid = await open_file(c, b"space")
        path = export_of(tmp_path) / "space"
        alloc = op(nfs4.OP_ALLOCATE, nfs4.ALLOCATE4args(sid, 0, 1 << 20))
        await c.expect(OK, putfh(fh), alloc)
        st = path.stat()
        assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20
        await c.expect(OK, putfh(fh), write(sid, 0, b"x" * (1 << 20)))
        dealloc = op(nfs4.OP_DEALLOCATE, nfs4.DEALLOCATE4args(sid, 64 << 10, 128 << 10))
        await c.expect(OK, putfh(fh), dealloc)
        data = path.read_bytes()
        assert len(data) == 1 << 20  # the size never changes
        assert data[: 64 << 10] == b"x" * (64 << 10)
        assert data[64 << 10 : 192 << 10] == bytes(128 << 10)
        assert data[192 << 10 :] == b"x" * ((1 << 20) - (192 << 10))
        with open(path, "rb") as f:
            assert os.lseek(f.fileno(), 0, os.SEEK_HOLE) == 64 << 10
        # Beyond the end: nothing to punch, nothing changes.
        dealloc = op(nfs4.OP_DEALLOCATE, nfs4.DEALLOCATE4args(sid, 4 << 20, 1 << 20))
        await c.expect(OK, putfh(fh), dealloc)
        assert path.stat().st_size == 1 << 20
        # Errors: zero length, past the largest file, an open for reading only.
        zero = op(nfs4.OP_ALLOCATE, nfs4.ALLOCATE4args(sid, 0, 0))
        await c.expect(nfs4.NFS4ERR_INVAL, putfh(fh), zero)
        huge = op(nfs4.OP_ALLOCATE, nfs4.ALLOCATE4args(sid, 1 << 63, 10))
        await c.expect(nfs4.NFS4ERR_FBIG, putfh(fh), huge)
        # Another client's open for reading only.
        other = await Client(srv, b"other", minor=2).mount()
        _, osid = await open_file(other, b"space", READ)
        ro = op(nfs4.OP_DEALLOCATE, nfs4.DEALLOCATE4args(osid, 0, 10))
        await other.expect(nfs4.NFS4ERR_OPENMODE, putfh(fh), ro)
        assert path.read_bytes() == data
    finally:
        close(srv)


# ---------------------------------------------------------------- COPY and CLONE


async def test_copy_synchronous_and_its_errors(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        content = os.urandom(300_000)
        src_fh, src_sid = await open_file(c, b"src")
        await c.expect(OK, putfh(src_fh), write(src_sid, 0, content))
        dst_fh, dst_sid = await open_file(c, b"dst")
        res = await c.expect(
            OK, putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, dst_sid, 0, 0, 0)
        )
        resok = c.value(res, 4)
        assert resok.cr_response.wr_count == len(content)
        assert resok.cr_response.wr_callback_id == []  # done before the reply
        assert resok.cr_requirements == nfs4.copy_requirements4(True, True)
        dst = export_of(tmp_path) / "dst"
        assert dst.read_bytes() == content
        # A range, to an offset.
        await c.expect(
            OK, putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, dst_sid, 10, 400_000, 100)
        )
        after = dst.read_bytes()
        assert after[400_000:] == content[10:110] and len(after) == 400_100

        async def refused(status: int, *ops: nfs4.nfs_argop4) -> None:
            await c.expect(status, *ops)
            assert dst.read_bytes() == after  # nothing changed

        # The source range past the source's end.
        await refused(
            nfs4.NFS4ERR_INVAL,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, dst_sid, len(content) + 1, 0, 1),
        )  # fmt: skip
        await refused(
            nfs4.NFS4ERR_INVAL,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, dst_sid, 10, 0, len(content)),
        )  # fmt: skip
        # Overlapping ranges in one file.
        await refused(
            nfs4.NFS4ERR_INVAL,
            putfh(dst_fh), SAVE, putfh(dst_fh), copy(dst_sid, dst_sid, 0, 50, 100),
        )  # fmt: skip
        # No saved filehandle.
        await refused(nfs4.NFS4ERR_NOFILEHANDLE, putfh(dst_fh), copy(src_sid, dst_sid, 0, 0, 1))
        # Inter-server copy is not offered; neither is COPY_NOTIFY.
        elsewhere = [nfs4.netloc4(nfs4.NL4_NAME, b"other-server")]
        await refused(
            nfs4.NFS4ERR_NOTSUPP,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, dst_sid, 0, 0, 1, elsewhere),
        )  # fmt: skip
        notify = op(
            nfs4.OP_COPY_NOTIFY,
            nfs4.COPY_NOTIFY4args(src_sid, nfs4.netloc4(nfs4.NL4_NAME, b"other-server")),
        )
        await refused(nfs4.NFS4ERR_NOTSUPP, putfh(src_fh), notify)
        # Stateids of the wrong file (the source's open used for the destination).
        await refused(
            nfs4.NFS4ERR_BAD_STATEID,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, src_sid, 0, 0, 1),
        )  # fmt: skip
        # A stateid that is no stateid of this server instance.
        bogus = nfs4.stateid4(1, b"\x01" * 12)
        await refused(
            nfs4.NFS4ERR_STALE_STATEID,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(src_sid, bogus, 0, 0, 1),
        )  # fmt: skip
        # The destination a directory.
        res = await c.expect(OK, ROOT, op(nfs4.OP_GETFH))
        root_fh = c.value(res, 2).object
        await refused(
            nfs4.NFS4ERR_ISDIR,
            putfh(src_fh), SAVE, putfh(root_fh), copy(src_sid, dst_sid, 0, 0, 1),
        )  # fmt: skip
        # The destination opened for reading only (another client).
        other = await Client(srv, b"other", minor=2).mount()
        _, ro_sid = await open_file(other, b"dst", READ)
        _, osrc = await open_file(other, b"src", READ)
        await other.expect(
            nfs4.NFS4ERR_OPENMODE,
            putfh(src_fh), SAVE, putfh(dst_fh), copy(osrc, ro_sid, 0, 0, 1),
        )  # fmt: skip
        assert dst.read_bytes() == after
        # Special stateids: the files are opened with the caller's credential.
        res = await c.expect(
            OK,
            putfh(src_fh), SAVE, putfh(dst_fh),
            copy(ANONYMOUS_STATEID, ANONYMOUS_STATEID, 0, 0, 5),
        )  # fmt: skip
        assert dst.read_bytes()[:5] == content[:5]
    finally:
        close(srv)


async def test_offload_operations_know_only_copy_stateids(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        fh, sid = await open_file(c, b"f")
        status = op(nfs4.OP_OFFLOAD_STATUS, nfs4.OFFLOAD_STATUS4args(sid))
        await c.expect(nfs4.NFS4ERR_BAD_STATEID, putfh(fh), status)
        cancel = op(nfs4.OP_OFFLOAD_CANCEL, nfs4.OFFLOAD_CANCEL4args(sid))
        await c.expect(nfs4.NFS4ERR_BAD_STATEID, putfh(fh), cancel)
        # Another client's copy is not this client's to ask about.
        o = srv.state.offloads.start(0xDEAD, fh, 10)
        status = op(nfs4.OP_OFFLOAD_STATUS, nfs4.OFFLOAD_STATUS4args(o.stateid))
        await c.expect(nfs4.NFS4ERR_BAD_STATEID, putfh(fh), status)
        srv.state.offloads.finish(o, OK)
    finally:
        close(srv)


async def test_clone_is_notsupp_where_the_file_system_cannot(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        src_fh, src_sid = await open_file(c, b"src")
        await c.expect(OK, putfh(src_fh), write(src_sid, 0, b"s" * BLOCK))
        dst_fh, dst_sid = await open_file(c, b"dst")
        clone = op(nfs4.OP_CLONE, nfs4.CLONE4args(src_sid, dst_sid, 0, 0, BLOCK))
        probe = os.open(export_of(tmp_path) / "probe", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            from nfsrdma.vfs import syscalls

            syscalls.clone_range(probe, 0, 0, probe, 0)
            can_clone = True
        except OSError:
            can_clone = False
        finally:
            os.close(probe)
        if can_clone:
            await c.expect(OK, putfh(src_fh), SAVE, putfh(dst_fh), clone)
            assert (export_of(tmp_path) / "dst").read_bytes() == b"s" * BLOCK
        else:
            await c.expect(nfs4.NFS4ERR_NOTSUPP, putfh(src_fh), SAVE, putfh(dst_fh), clone)
            assert (export_of(tmp_path) / "dst").read_bytes() == b""
        # Past the source's end: NFS4ERR_INVAL either way.
        clone = op(nfs4.OP_CLONE, nfs4.CLONE4args(src_sid, dst_sid, 0, 0, 2 * BLOCK))
        await c.expect(nfs4.NFS4ERR_INVAL, putfh(src_fh), SAVE, putfh(dst_fh), clone)
    finally:
        close(srv)


# ---------------------------------------------------------------- extended attributes


def setxattr(name: bytes, value: bytes, how: int = nfs4.SETXATTR4_EITHER) -> nfs4.nfs_argop4:
    return op(nfs4.OP_SETXATTR, nfs4.SETXATTR4args(nfs4.setxattr_option4(how), name, value))


def getxattr(name: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETXATTR, nfs4.GETXATTR4args(name))


def listxattrs(cookie: int = 0, maxcount: int = 4096) -> nfs4.nfs_argop4:
    return op(nfs4.OP_LISTXATTRS, nfs4.LISTXATTRS4args(cookie, maxcount))


def removexattr(name: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_REMOVEXATTR, nfs4.REMOVEXATTR4args(name))


async def test_extended_attributes_in_the_user_namespace(tmp_path: Path, clock: Clock) -> None:
    srv, c = await v42(tmp_path)
    try:
        fh, _ = await open_file(c, b"f")
        path = export_of(tmp_path) / "f"
        res = await c.expect(OK, putfh(fh), setxattr(b"colour", b"blue", nfs4.SETXATTR4_CREATE))
        info = c.value(res, 2)
        assert info.after != info.before
        assert os.getxattr(path, "user.colour") == b"blue"  # the VFS added the prefix
        await c.expect(nfs4.NFS4ERR_EXIST, putfh(fh), setxattr(b"colour", b"red", 1))
        await c.expect(nfs4.NFS4ERR_NOXATTR, putfh(fh), setxattr(b"size", b"9", 2))
        await c.expect(OK, putfh(fh), setxattr(b"colour", b"green", nfs4.SETXATTR4_REPLACE))
        res = await c.expect(OK, putfh(fh), getxattr(b"colour"))
        assert bytes(c.value(res, 2)) == b"green"
        await c.expect(nfs4.NFS4ERR_NOXATTR, putfh(fh), getxattr(b"missing"))
        # Attributes outside user. are invisible; a wire name never leaves user.
        os.setxattr(path, "trusted.secret", b"x")
        for name in (b"a", b"bb", b"ccc"):
            await c.expect(OK, putfh(fh), setxattr(name, b"v"))
        res = await c.expect(OK, putfh(fh), listxattrs())
        body = c.value(res, 2)
        assert body.lxr_names == [b"a", b"bb", b"ccc", b"colour"] and body.lxr_eof
        await c.expect(OK, putfh(fh), setxattr(b"trusted.secret", b"y"))
        assert os.getxattr(path, "trusted.secret") == b"x"
        assert os.getxattr(path, "user.trusted.secret") == b"y"
        await c.expect(OK, putfh(fh), removexattr(b"trusted.secret"))
        # Paging with the cookie: each name costs 8 octets here, the result 16 more.
        res = await c.expect(OK, putfh(fh), listxattrs(0, 16 + 16))
        body = c.value(res, 2)
        assert body.lxr_names == [b"a", b"bb"] and not body.lxr_eof
        res = await c.expect(OK, putfh(fh), listxattrs(body.lxr_cookie, 16 + 16))
        body = c.value(res, 2)
        assert body.lxr_names == [b"ccc"] and not body.lxr_eof
        res = await c.expect(OK, putfh(fh), listxattrs(body.lxr_cookie, 16 + 16))
        body = c.value(res, 2)
        assert body.lxr_names == [b"colour"] and body.lxr_eof
        await c.expect(nfs4.NFS4ERR_TOOSMALL, putfh(fh), listxattrs(0, 16 + 4))
        await c.expect(nfs4.NFS4ERR_BAD_COOKIE, putfh(fh), listxattrs(99))
        # Removal.
        await c.expect(OK, putfh(fh), removexattr(b"a"))
        await c.expect(nfs4.NFS4ERR_NOXATTR, putfh(fh), removexattr(b"a"))
        # Limits: the value, the name; nothing changed.
        before = sorted(os.listxattr(path))
        await c.expect(nfs4.NFS4ERR_XATTR2BIG, putfh(fh), setxattr(b"big", bytes(65537)))
        await c.expect(nfs4.NFS4ERR_NAMETOOLONG, putfh(fh), setxattr(b"n" * 251, b"v"))
        await c.expect(nfs4.NFS4ERR_INVAL, putfh(fh), setxattr(b"\xff\xfe", b"v"))
        assert sorted(os.listxattr(path)) == before
    finally:
        close(srv)


async def test_xattr_permission_is_the_file_systems(tmp_path: Path, clock: Clock) -> None:
    """Another user may read root's 0644 file's attributes but not change them."""
    srv, c = await v42(tmp_path)
    try:
        fh, _ = await open_file(c, b"f")
        await c.expect(OK, putfh(fh), setxattr(b"k", b"v"))
        os.chmod(export_of(tmp_path) / "f", 0o644)

        async def as_user(*ops: nfs4.nfs_argop4) -> nfs4.COMPOUND4res:
            seq = op_sequence(c.sessionid, c.seqid)
            c.seqid += 1
            res, _ = await srv.call(c.conn, [seq, putfh(fh), *ops], USER_CRED, minor=2)
            return res

        res = await as_user(getxattr(b"k"))
        assert res.status == OK and bytes(c.value(res, 2)) == b"v"
        res = await as_user(setxattr(b"k", b"w"))
        assert res.status in (nfs4.NFS4ERR_ACCESS, nfs4.NFS4ERR_PERM), status_list(res)
        res = await as_user(removexattr(b"k"))
        assert res.status in (nfs4.NFS4ERR_ACCESS, nfs4.NFS4ERR_PERM), status_list(res)
        srv.state.vfs.release_identity()  # this thread ran the VFS as the other user
        assert os.getxattr(export_of(tmp_path) / "f", "user.k") == b"v"
    finally:
        close(srv)
