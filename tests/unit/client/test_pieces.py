"""Small pure pieces of the client: URLs (UL-9 default port), fattr4 values through the
generated codecs, NFS4ERR_* to Python exceptions, open modes, buffer identity for RDMA sinks."""

from __future__ import annotations

import errno
import stat
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.client.attrs import (
    STAT_ATTRS,
    FileStat,
    decode_attrs,
    decode_bitmap,
    encode_attrs,
    encode_bitmap,
    file_stat,
    owner_to_id,
)
from nfsrdma.client.errors import NfsError, nfs_error
from nfsrdma.client.file import parse_mode, same_memory
from nfsrdma.client.url import parse_url
from nfsrdma.session.client_setup import SessionOptions, create_session_args, negotiated
from nfsrdma.xdr.gen import nfs4


def test_urls() -> None:
    u = parse_url("rdma://server/export/dir/")
    assert (u.scheme, u.host, u.port, u.path, u.transport) == (
        "rdma",
        "server",
        20049,
        "/export/dir",
        "rdma",
    )
    u = parse_url("nfs://[fe80::1]:2050")
    assert (u.host, u.port, u.path, str(u)) == ("fe80::1", 2050, "/", "nfs://[fe80::1]:2050/")
    assert parse_url("NFS://h/a/../b").path == "/b"
    assert parse_url("nfs://h/x%20y").path == "/x y"
    for bad in ("http://h/", "nfs:///path", "nfs://h:99999/"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_bitmaps_and_attribute_round_trip() -> None:
    assert encode_bitmap([0, 33, 55]) == [1, (1 << 1) | (1 << 23)]
    assert decode_bitmap(encode_bitmap(STAT_ATTRS)) == sorted(STAT_ATTRS)
    values = {
        nfs4.FATTR4_TYPE: nfs4.NF4DIR,
        nfs4.FATTR4_SIZE: 4096,
        nfs4.FATTR4_MODE: 0o750,
        nfs4.FATTR4_OWNER: b"1000",
        nfs4.FATTR4_OWNER_GROUP: b"100",
        nfs4.FATTR4_TIME_MODIFY: nfs4.nfstime4(12, 345),
        nfs4.FATTR4_FSID: nfs4.fsid4(1, 2),
    }
    back = decode_attrs(encode_attrs(values))
    assert back == values
    st = file_stat(back)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750
    assert (st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns) == (1000, 100, 4096, 12_000_000_345)
    assert st.st_dev == (1 << 32) | 2 and st.is_dir()


def test_unknown_attribute_stops_decoding() -> None:
    f = nfs4.fattr4(encode_bitmap([nfs4.FATTR4_SIZE, 90]), (7).to_bytes(8, "big") + b"????")
    assert decode_attrs(f) == {nfs4.FATTR4_SIZE: 7}


def test_owner_strings() -> None:
    assert owner_to_id(b"42") == 42
    assert owner_to_id(b"root@example.org") == 0
    assert owner_to_id(b"no-such-user-xyz@x") == 65534


@pytest.mark.parametrize(
    ("status", "cls", "code"),
    [
        (nfs4.NFS4ERR_NOENT, FileNotFoundError, errno.ENOENT),
        (nfs4.NFS4ERR_ACCESS, PermissionError, errno.EACCES),
        (nfs4.NFS4ERR_PERM, PermissionError, errno.EPERM),
        (nfs4.NFS4ERR_EXIST, FileExistsError, errno.EEXIST),
        (nfs4.NFS4ERR_ISDIR, IsADirectoryError, errno.EISDIR),
        (nfs4.NFS4ERR_NOTDIR, NotADirectoryError, errno.ENOTDIR),
        (nfs4.NFS4ERR_DENIED, BlockingIOError, errno.EAGAIN),
        (nfs4.NFS4ERR_NOTEMPTY, OSError, errno.ENOTEMPTY),
        (nfs4.NFS4ERR_NOSPC, OSError, errno.ENOSPC),
        (nfs4.NFS4ERR_SERVERFAULT, OSError, errno.EIO),
    ],
)
def test_errors_map_to_python_exceptions(status: int, cls: type[OSError], code: int) -> None:
    e = nfs_error(status, "LOOKUP", "/a/b")
    assert isinstance(e, cls) and isinstance(e, NfsError)
    assert e.errno == code and e.status == status and e.filename == "/a/b"
    assert nfs4.nfsstat4(status).name in str(e)


def test_open_modes() -> None:
    r = parse_mode("rb")
    assert r.readable and not r.writable and r.create is None
    w = parse_mode("w")
    assert w.writable and not w.readable and w.truncate and w.create == nfs4.UNCHECKED4
    assert parse_mode("xb").create == nfs4.GUARDED4
    a = parse_mode("a+")
    assert a.append and a.readable and a.writable
    for bad in ("rt", "rw", "", "q", "rr", "r+t"):
        with pytest.raises(ValueError):
            parse_mode(bad)


def test_same_memory_detects_data_placed_in_the_sink() -> None:
    buf = bytearray(64)
    sink = memoryview(buf)[16:48]
    assert same_memory(sink[:10], sink)  # RDMA placed it: no copy needed
    assert not same_memory(memoryview(buf)[17:27], sink)
    assert not same_memory(bytes(10), sink)
    assert not same_memory(memoryview(b"x" * 10), sink)


def test_channel_attributes_and_negotiation() -> None:
    """UL-33..UL-36: headerpadsize 0, empty ca_rdma_ird, no CONN_RDMA; sizes follow the
    server's grant (the smaller of sent and returned, UL-6)."""
    opts = SessionOptions(slots=64, rsize=1 << 20, wsize=1 << 20)
    args = create_session_args(opts, 7, 1)
    fore = args.csa_fore_chan_attrs
    assert fore.ca_headerpadsize == 0 and fore.ca_rdma_ird == [] and fore.ca_maxrequests == 64
    assert not args.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_RDMA
    assert args.csa_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    assert args.csa_back_chan_attrs.ca_maxrequestsize <= 4096
    granted = nfs4.channel_attrs4(0, 262144 + 300, 131072 + 300, 2048, 8, 16, [])
    res = nfs4.CREATE_SESSION4resok(b"s" * 16, 1, 0, granted, args.csa_back_chan_attrs)
    n = negotiated(opts, res)
    assert (n.slots, n.max_operations, n.backchannel) == (16, 8, False)
    assert n.rsize == 126976 - 126976 % 4096 and n.rsize % 4096 == 0 and n.rsize <= 131072
    assert n.wsize <= 262144 and n.wsize % 4096 == 0


@pytest.mark.parametrize(
    ("ftype", "fmt"),
    [
        (nfs4.NF4REG, stat.S_IFREG),
        (nfs4.NF4DIR, stat.S_IFDIR),
        (nfs4.NF4BLK, stat.S_IFBLK),
        (nfs4.NF4CHR, stat.S_IFCHR),
        (nfs4.NF4LNK, stat.S_IFLNK),
        (nfs4.NF4SOCK, stat.S_IFSOCK),
        (nfs4.NF4FIFO, stat.S_IFIFO),
        (nfs4.NF4ATTRDIR, 0),  # no S_IFMT of its own: the permission bits alone
    ],
)
def test_file_stat_of_each_type_is_an_immutable_stat_result(ftype: int, fmt: int) -> None:
    """RFC 8881 section 5.8.1.2 (type) and 6.2.4 (mode) become st_mode as os.stat has it."""
    st = file_stat(
        {
            nfs4.FATTR4_TYPE: nfs4.nfs_ftype4(ftype),
            nfs4.FATTR4_MODE: 0o4755,
            nfs4.FATTR4_RAWDEV: nfs4.specdata4(8, 1),
            nfs4.FATTR4_SPACE_USED: 1025,
            nfs4.FATTR4_CHANGE: 9,
        }
    )
    assert st.st_mode == fmt | 0o4755 and st.type == ftype
    assert (st.st_rdev, st.st_blocks, st.change, st.st_nlink) == (8 << 8 | 1, 3, 9, 1)
    assert (st.st_uid, st.st_gid, st.owner) == (65534, 65534, "")
    with pytest.raises(AttributeError):
        st.st_size = 1  # type: ignore[misc]
    assert st == file_stat({nfs4.FATTR4_TYPE: ftype, nfs4.FATTR4_MODE: 0o4755})._replace(
        st_rdev=8 << 8 | 1, st_blocks=3, change=9
    )
    assert hash(st) == hash(st._replace())


def test_split_path_agrees_with_normalising_first() -> None:
    """The shortcut for plain paths gives what normalising (``.``, ``..``, empty components,
    leading and trailing slashes) and splitting gives, for every mix of those."""
    import random

    from nfsrdma.client.fs import split_path
    from nfsrdma.client.url import normalise

    def reference(path: str) -> list[bytes]:
        return [
            p.encode("utf-8", "surrogateescape")
            for p in normalise(path).split("/")
            if p and p != "."
        ]

    rng = random.Random(5661)
    pieces = ["a", "bb", ".", "..", "", "...", ".x", "x.", "é", "\udcff", " "]
    cases = ["", "/", "//", "a", "/a/b/", "a/../..", "../a", "./a", "a//b", "a/./b"]
    for _ in range(3000):
        parts = [rng.choice(pieces) for _ in range(rng.randint(1, 5))]
        cases.append(rng.choice(["", "/", "//"]) + "/".join(parts) + rng.choice(["", "/"]))
    for path in cases:
        assert split_path(path) == reference(path), path


_S_IFMT = {
    nfs4.NF4REG: stat.S_IFREG,
    nfs4.NF4DIR: stat.S_IFDIR,
    nfs4.NF4BLK: stat.S_IFBLK,
    nfs4.NF4CHR: stat.S_IFCHR,
    nfs4.NF4LNK: stat.S_IFLNK,
    nfs4.NF4SOCK: stat.S_IFSOCK,
    nfs4.NF4FIFO: stat.S_IFIFO,
}


def _file_stat_reference(values: dict[int, Any]) -> tuple[Any, ...]:
    """file_stat as first written: every value through ``dict.get`` and ``owner_to_id``."""
    get = values.get

    def ns(t: Any) -> int:
        return 0 if t is None else t.seconds * 1_000_000_000 + t.nseconds

    ftype = int(get(nfs4.FATTR4_TYPE, nfs4.NF4REG))
    fsid, rawdev = get(nfs4.FATTR4_FSID), get(nfs4.FATTR4_RAWDEV)
    owner = bytes(get(nfs4.FATTR4_OWNER, b""))
    group = bytes(get(nfs4.FATTR4_OWNER_GROUP, b""))
    return (
        _S_IFMT.get(ftype, 0) | int(get(nfs4.FATTR4_MODE, 0)) & 0o7777,
        int(get(nfs4.FATTR4_FILEID, 0)),
        ((fsid.major & 0xFFFFFFFF) << 32 | (fsid.minor & 0xFFFFFFFF)) if fsid else 0,
        int(get(nfs4.FATTR4_NUMLINKS, 1)),
        owner_to_id(owner) if owner else 65534,
        owner_to_id(group, group=True) if group else 65534,
        int(get(nfs4.FATTR4_SIZE, 0)),
        ns(get(nfs4.FATTR4_TIME_ACCESS)),
        ns(get(nfs4.FATTR4_TIME_MODIFY)),
        ns(get(nfs4.FATTR4_TIME_METADATA)),
        (int(get(nfs4.FATTR4_SPACE_USED, 0)) + 511) // 512,
        (rawdev.specdata1 << 8 | rawdev.specdata2) if rawdev else 0,
        ftype,
        int(get(nfs4.FATTR4_CHANGE, 0)),
        owner.decode("utf-8", "replace"),
        group.decode("utf-8", "replace"),
    )


_OWNERS = st.one_of(
    st.sampled_from([b"", b"0", b"1000", b"0001000", b"4294967294", b"4294967295", b"99999999999"]),
    st.sampled_from([b"00000000001", b"root@example.org", b"no-such-user-xyz@x", b"\xff\xfe"]),
    st.binary(max_size=12),
    st.integers(0, 2**40).map(lambda n: str(n).encode()),
)
_U64 = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(
    present=st.sets(st.sampled_from(sorted(STAT_ATTRS))),
    ftype=st.sampled_from(list(nfs4.nfs_ftype4)),
    owners=st.tuples(_OWNERS, _OWNERS),
    numbers=st.tuples(_U64, _U64, _U64, _U64, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    times=st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 999_999_999)),
        min_size=3,
        max_size=3,
    ),
)
def test_file_stat_agrees_with_the_reference(
    present: set[int],
    ftype: nfs4.nfs_ftype4,
    owners: tuple[bytes, bytes],
    numbers: tuple[int, ...],
    times: list[tuple[int, int]],
) -> None:
    """file_stat (numeric owners parsed inline, the tuple made directly) gives, for any subset
    of the attributes ``stat`` asks for, what the plain reading of every value gives."""
    size, fileid, change, used, mode, nlink = numbers
    every = {
        nfs4.FATTR4_TYPE: ftype,
        nfs4.FATTR4_CHANGE: change,
        nfs4.FATTR4_SIZE: size,
        nfs4.FATTR4_FSID: nfs4.fsid4(fileid, change),
        nfs4.FATTR4_FILEID: fileid,
        nfs4.FATTR4_MODE: mode,
        nfs4.FATTR4_NUMLINKS: nlink,
        nfs4.FATTR4_OWNER: owners[0],
        nfs4.FATTR4_OWNER_GROUP: owners[1],
        nfs4.FATTR4_RAWDEV: nfs4.specdata4(mode, nlink),
        nfs4.FATTR4_SPACE_USED: used,
        nfs4.FATTR4_TIME_ACCESS: nfs4.nfstime4(*times[0]),
        nfs4.FATTR4_TIME_METADATA: nfs4.nfstime4(*times[1]),
        nfs4.FATTR4_TIME_MODIFY: nfs4.nfstime4(*times[2]),
    }
    values = {n: v for n, v in every.items() if n in present}
    got = file_stat(values)
    assert type(got) is FileStat
    assert tuple(got) == _file_stat_reference(values)
