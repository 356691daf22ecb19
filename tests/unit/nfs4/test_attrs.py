"""fattr4 encoding and decoding (nfsrdma.nfs4.attrs), checked against the generated XDR
decoders of every attribute (RFC 8881 section 5)."""

from __future__ import annotations

import contextlib
import struct
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4 import attrs
from nfsrdma.nfs4.attr_encode import EncoderCache
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.vfs.base import SET_TO_SERVER_TIME, Attributes, FileType, FsStats
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.nfs4_fattr import MASKS
from nfsrdma.xdr.runtime import Reader, Writer, XdrError, pack

CONFIG = ServerConfig(lease_time=77, max_io=1 << 19)
FH = bytes(range(1, 27))  # 26 octets: exercises opaque padding
ATTRS = Attributes(
    type=FileType.NF4REG,
    mode=0o4755,
    nlink=3,
    uid=1000,
    gid=100,
    size=123456789012,
    space_used=8192,
    rdev=(0, 0),
    fsid=(8, 1),
    fileid=0xFEDCBA9876,
    mounted_on_fileid=0xFEDCBA9876,
    atime_ns=-1_500_000_001,  # before 1970: seconds -2, nseconds 499999999
    mtime_ns=1_700_000_000_123_456_789,
    ctime_ns=1_700_000_001_000_000_000,
    change=1_700_000_001_000_000_003,
)
FS = FsStats(
    files_total=1000,
    files_free=900,
    files_avail=800,
    bytes_total=1 << 40,
    bytes_free=1 << 39,
    bytes_avail=1 << 38,
    max_name=255,
    max_link=65000,
)
ALL_WORDS = [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]
ATTR_NAMES = {
    getattr(nfs4, n): n.removeprefix("FATTR4_").lower()
    for n in dir(nfs4)
    if n.startswith("FATTR4_")
}


def decode_all(fattr: nfs4.fattr4) -> dict[str, Any]:
    """Decode attr_vals with the generated per-attribute decoders, in bit order."""
    r = Reader(fattr.attr_vals)
    off = 0
    out: dict[str, Any] = {}
    for n in attrs.attr_numbers(fattr.attrmask):
        name = ATTR_NAMES[n]
        out[name], off = getattr(nfs4, f"dec_fattr4_{name}")(r, off)
    assert off == len(fattr.attr_vals)
    return out


def fattr(pairs: list[tuple[int, bytes]]) -> nfs4.fattr4:
    pairs = sorted(pairs)
    return nfs4.fattr4(attrs.bitmap_of(n for n, _ in pairs), b"".join(v for _, v in pairs))


def utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    w = Writer()
    nfs4.enc_utf8str_mixed(w, b)
    return bytes(w)


def settime(how: int, sec: int = 0, nsec: int = 0) -> bytes:
    return pack(nfs4.enc_settime4, nfs4.settime4(nfs4.time_how4(how), nfs4.nfstime4(sec, nsec)))


# ---------------------------------------------------------------- bitmaps


@given(st.sets(st.integers(0, 200)))
def test_bitmap_round_trip(numbers: set[int]) -> None:
    bitmap = attrs.bitmap_of(numbers)
    assert attrs.attr_numbers(bitmap) == sorted(numbers)
    assert not bitmap or bitmap[-1] != 0


def test_bitmap_words() -> None:
    assert attrs.bitmap_of([0, 31, 32, 75]) == [0x80000001, 1, 1 << 11]
    assert attrs.attr_numbers([0, 0, 1 << 11]) == [75]
    assert attrs.bitmap_of([]) == []


# ---------------------------------------------------------------- what is advertised


def test_supported_attrs_are_what_the_server_can_return() -> None:
    got = decode_all(attrs.encode_attrs([1 << nfs4.FATTR4_TYPE], ATTRS, None, FH, CONFIG))
    assert got == {"type": nfs4.NF4REG}
    supported = decode_all(attrs.encode_attrs([1], ATTRS, None, FH, CONFIG))
    numbers = set(attrs.attr_numbers(supported["supported_attrs"]))
    assert numbers == attrs.SUPPORTED
    # REQUIRED attributes (RFC 8881 section 5.6) are all there ...
    required = set(range(0, 12)) | {nfs4.FATTR4_FILEHANDLE, nfs4.FATTR4_SUPPATTR_EXCLCREAT}
    assert required <= numbers
    # ... and nothing the server cannot answer correctly.
    for absent in (
        nfs4.FATTR4_ACL,
        nfs4.FATTR4_FS_LOCATIONS,
        nfs4.FATTR4_FS_LAYOUT_TYPES,
        nfs4.FATTR4_TIME_CREATE,
        nfs4.FATTR4_ARCHIVE,
        nfs4.FATTR4_MIMETYPE,
        nfs4.FATTR4_QUOTA_USED,
        nfs4.FATTR4_DACL,
    ):
        assert absent not in numbers


def test_every_supported_attribute_encodes_as_the_generated_decoder_reads_it() -> None:
    f = attrs.encode_attrs(ALL_WORDS, ATTRS, FS, FH, CONFIG)
    got = decode_all(f)
    readable = attrs.SUPPORTED - {nfs4.FATTR4_TIME_ACCESS_SET, nfs4.FATTR4_TIME_MODIFY_SET}
    assert set(attrs.attr_numbers(f.attrmask)) == readable
    assert got["type"] == nfs4.NF4REG
    assert got["fh_expire_type"] == nfs4.FH4_PERSISTENT
    assert got["change"] == ATTRS.change
    assert got["size"] == ATTRS.size
    assert got["link_support"] is True and got["symlink_support"] is True
    assert got["named_attr"] is False
    assert got["fsid"] == nfs4.fsid4(8, 1)
    assert got["unique_handles"] is True
    assert got["lease_time"] == 77
    assert got["rdattr_error"] == nfs4.NFS4_OK
    assert got["filehandle"] == FH
    assert set(attrs.attr_numbers(got["suppattr_exclcreat"])) == attrs.SUPPATTR_EXCLCREAT
    assert got["aclsupport"] == 0
    assert got["cansettime"] is True
    assert got["case_insensitive"] is False and got["case_preserving"] is True
    assert got["chown_restricted"] is True
    assert got["fileid"] == ATTRS.fileid
    assert (got["files_avail"], got["files_free"], got["files_total"]) == (800, 900, 1000)
    assert got["homogeneous"] is True
    assert got["maxfilesize"] == (1 << 63) - 1
    assert (got["maxlink"], got["maxname"]) == (65000, 255)
    assert got["maxread"] == got["maxwrite"] == 1 << 19
    assert got["mode"] == 0o4755
    assert got["no_trunc"] is True
    assert got["numlinks"] == 3
    assert got["owner"] == b"1000" and got["owner_group"] == b"100"
    assert got["rawdev"] == nfs4.specdata4(0, 0)
    assert got["space_avail"] == 1 << 38
    assert got["space_free"] == 1 << 39
    assert got["space_total"] == 1 << 40
    assert got["space_used"] == 8192
    assert got["time_access"] == nfs4.nfstime4(-2, 499_999_999)
    assert got["time_delta"] == nfs4.nfstime4(0, 1)
    assert got["time_metadata"] == nfs4.nfstime4(1_700_000_001, 0)
    assert got["time_modify"] == nfs4.nfstime4(1_700_000_000, 123_456_789)
    assert got["mounted_on_fileid"] == ATTRS.fileid


def test_unsupported_and_write_only_bits_are_left_out() -> None:
    request = attrs.bitmap_of(
        [
            nfs4.FATTR4_SIZE,
            nfs4.FATTR4_ACL,
            nfs4.FATTR4_FS_LOCATIONS,
            nfs4.FATTR4_TIME_ACCESS_SET,
            nfs4.FATTR4_FS_CHARSET_CAP,
            200,
        ]
    )
    f = attrs.encode_attrs(request, ATTRS, None, FH, CONFIG)
    assert f.attrmask == [1 << nfs4.FATTR4_SIZE]
    assert decode_all(f) == {"size": ATTRS.size}
    empty = attrs.encode_attrs([0, 0, 0, 0], ATTRS, None, FH, CONFIG)
    assert (empty.attrmask, empty.attr_vals) == ([], b"")


def test_huge_request_bitmap_is_cheap() -> None:
    """A bitmap4 of 100 000 words costs no more than its first words (robustness)."""
    t0 = time.perf_counter()
    f = attrs.encode_attrs([1 << nfs4.FATTR4_TYPE] + [0xFFFFFFFF] * 100_000, ATTRS, FS, FH, CONFIG)
    assert time.perf_counter() - t0 < 0.5
    assert nfs4.FATTR4_TYPE in attrs.attr_numbers(f.attrmask)


def linux_getattr_bitmap() -> list[int]:
    """What the Linux NFSv4.1 client asks for after most operations (nfs4_fattr_bitmap)."""
    return attrs.bitmap_of([getattr(nfs4, f"FATTR4_{n.upper()}") for n in MASKS["linux_fattr"]])


def test_linux_getattr_bitmap() -> None:
    f = attrs.encode_attrs(linux_getattr_bitmap(), ATTRS, None, FH, CONFIG)
    got = decode_all(f)
    assert got["owner"] == b"1000" and got["mounted_on_fileid"] == ATTRS.fileid
    assert not attrs.needs_fsstats(linux_getattr_bitmap())


def test_fsstats_needed_only_for_file_system_attributes() -> None:
    space = attrs.bitmap_of([nfs4.FATTR4_SPACE_AVAIL])
    assert attrs.needs_fsstats(space)
    assert not attrs.needs_fsstats(attrs.bitmap_of([nfs4.FATTR4_SPACE_USED]))
    with pytest.raises(ValueError):
        attrs.encode_attrs(space, ATTRS, None, FH, CONFIG)


def test_returned_mask_is_a_copy() -> None:
    bitmap = attrs.bitmap_of([nfs4.FATTR4_SIZE])
    f = attrs.encode_attrs(bitmap, ATTRS, None, FH, CONFIG)
    f.attrmask.append(7)
    assert attrs.encode_attrs(bitmap, ATTRS, None, FH, CONFIG).attrmask == bitmap


def test_encoder_cache_is_bounded() -> None:
    cache = EncoderCache(frozenset({nfs4.FATTR4_TYPE, nfs4.FATTR4_SIZE}), capacity=4)
    for i in range(20):
        cache.encode([0b10010, i], ATTRS, None, FH, CONFIG, 0)
    assert len(cache._plans) <= 4
    with pytest.raises(ValueError):
        EncoderCache(frozenset({nfs4.FATTR4_ACL}))


def test_large_values() -> None:
    big = Attributes(**{**_fields(ATTRS), "nlink": 0xFFFFFFFF, "rdev": (259, 7)})
    f = attrs.encode_attrs(
        attrs.bitmap_of([nfs4.FATTR4_NUMLINKS, nfs4.FATTR4_RAWDEV]), big, None, FH, CONFIG
    )
    got = decode_all(f)
    assert got["numlinks"] == 0xFFFFFFFF
    assert got["rawdev"] == nfs4.specdata4(259, 7)


def _fields(a: Attributes) -> dict[str, Any]:
    return {name: getattr(a, name) for name in a.__slots__}


def test_rdattr_error_alone() -> None:
    f = attrs.encode_rdattr_error(nfs4.NFS4ERR_ACCESS)
    assert decode_all(f) == {"rdattr_error": nfs4.NFS4ERR_ACCESS}
    f2 = attrs.encode_attrs(
        attrs.bitmap_of([nfs4.FATTR4_RDATTR_ERROR]), ATTRS, None, FH, CONFIG, nfs4.NFS4ERR_PERM
    )
    assert decode_all(f2) == {"rdattr_error": nfs4.NFS4ERR_PERM}


# ---------------------------------------------------------------- settable attributes


def test_decode_settable_all() -> None:
    f = fattr(
        [
            (nfs4.FATTR4_SIZE, struct.pack(">Q", 4096)),
            (nfs4.FATTR4_MODE, struct.pack(">I", 0o2750)),
            (nfs4.FATTR4_OWNER, utf8("1234")),
            (nfs4.FATTR4_OWNER_GROUP, utf8("root")),
            (nfs4.FATTR4_TIME_ACCESS_SET, settime(nfs4.SET_TO_SERVER_TIME4)),
            (nfs4.FATTR4_TIME_MODIFY_SET, settime(nfs4.SET_TO_CLIENT_TIME4, -5, 7)),
        ]
    )
    s = attrs.decode_settable(f)
    assert (s.size, s.mode, s.uid, s.gid) == (4096, 0o2750, 1234, 0)
    assert s.atime is SET_TO_SERVER_TIME
    assert s.mtime == -5 * 10**9 + 7
    assert s.attrset == f.attrmask
    assert s


def test_decode_settable_empty() -> None:
    s = attrs.decode_settable(nfs4.fattr4([], b""))
    assert not s and s.attrset == []
    assert s.mode is s.uid is s.gid is s.size is s.atime is s.mtime is None


@pytest.mark.parametrize(
    ("owner", "uid"),
    [("0", 0), ("root", 0), ("root@example.org", 0), ("4294967294", 4294967294)],
)
def test_owner_forms(owner: str, uid: int) -> None:
    assert attrs.decode_settable(fattr([(nfs4.FATTR4_OWNER, utf8(owner))])).uid == uid


@pytest.mark.parametrize(
    ("owner", "status"),
    [
        ("no-such-user-xyzzy", nfs4.NFS4ERR_BADOWNER),
        ("no-such-user-xyzzy@example.org", nfs4.NFS4ERR_BADOWNER),
        ("@example.org", nfs4.NFS4ERR_BADOWNER),
        ("4294967295", nfs4.NFS4ERR_BADOWNER),  # (uid_t)-1: "unchanged" to chown(2)
        ("99999999999", nfs4.NFS4ERR_BADOWNER),
        (b"\xff\xfe", nfs4.NFS4ERR_INVAL),  # not UTF-8
        ("", nfs4.NFS4ERR_INVAL),
    ],
)
def test_bad_owners(owner: str | bytes, status: int) -> None:
    for attr in (nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP):
        with pytest.raises(Nfs4Error) as e:
            attrs.decode_settable(fattr([(attr, utf8(owner))]))
        assert e.value.status == status


def test_unknown_group_name() -> None:
    with pytest.raises(Nfs4Error) as e:
        attrs.decode_settable(fattr([(nfs4.FATTR4_OWNER_GROUP, utf8("no-such-group-xyzzy"))]))
    assert e.value.status == nfs4.NFS4ERR_BADOWNER


@pytest.mark.parametrize(
    ("pairs", "status"),
    [
        ([(nfs4.FATTR4_ACL, b"\0\0\0\0")], nfs4.NFS4ERR_ATTRNOTSUPP),  # unsupported
        ([(nfs4.FATTR4_HIDDEN, b"\0\0\0\0")], nfs4.NFS4ERR_ATTRNOTSUPP),
        ([(100, b"")], nfs4.NFS4ERR_ATTRNOTSUPP),
        ([(nfs4.FATTR4_TYPE, b"\0\0\0\1")], nfs4.NFS4ERR_INVAL),  # read-only
        ([(nfs4.FATTR4_TIME_MODIFY, b"\0" * 12)], nfs4.NFS4ERR_INVAL),
        ([(nfs4.FATTR4_MODE, struct.pack(">I", 0o10644))], nfs4.NFS4ERR_INVAL),  # out of range
        (
            [(nfs4.FATTR4_TIME_MODIFY_SET, settime(nfs4.SET_TO_CLIENT_TIME4, 1, 10**9))],
            nfs4.NFS4ERR_INVAL,
        ),
    ],
)
def test_settable_errors(pairs: list[tuple[int, bytes]], status: int) -> None:
    with pytest.raises(Nfs4Error) as e:
        attrs.decode_settable(fattr(pairs))
    assert e.value.status == status


def test_unsupported_checked_before_read_only() -> None:
    with pytest.raises(Nfs4Error) as e:
        attrs.decode_settable(fattr([(nfs4.FATTR4_TYPE, b"\0\0\0\1"), (nfs4.FATTR4_ACL, b"")]))
    assert e.value.status == nfs4.NFS4ERR_ATTRNOTSUPP


@pytest.mark.parametrize(
    "vals",
    [
        b"",  # nothing for the size
        b"\0\0\0\0\0\0\x10",  # truncated size
        b"\0" * 8 + b"\0",  # trailing octet
        b"\0" * 12,  # trailing word
    ],
)
def test_settable_bad_xdr(vals: bytes) -> None:
    with pytest.raises(XdrError):
        attrs.decode_settable(nfs4.fattr4(attrs.bitmap_of([nfs4.FATTR4_SIZE]), vals))


def test_settable_bad_xdr_in_strings_and_times() -> None:
    owner = attrs.bitmap_of([nfs4.FATTR4_OWNER])
    with pytest.raises(XdrError):  # length beyond the list
        attrs.decode_settable(nfs4.fattr4(owner, struct.pack(">I", 100) + b"abcd"))
    with pytest.raises(XdrError):  # padding missing
        attrs.decode_settable(nfs4.fattr4(owner, struct.pack(">I", 2) + b"10"))
    mtime = attrs.bitmap_of([nfs4.FATTR4_TIME_MODIFY_SET])
    with pytest.raises(XdrError):  # time_how4 out of range
        attrs.decode_settable(nfs4.fattr4(mtime, struct.pack(">I", 2)))
    with pytest.raises(XdrError):  # nfstime4 truncated
        attrs.decode_settable(nfs4.fattr4(mtime, struct.pack(">II", 1, 0)))


@given(st.binary(max_size=64), st.sets(st.sampled_from(sorted(attrs.SETTABLE))))
def test_settable_never_crashes(vals: bytes, numbers: set[int]) -> None:
    """Whatever the octets: a Settable, an Nfs4Error or an XdrError (SEC-8)."""
    with contextlib.suppress(Nfs4Error, XdrError):
        attrs.decode_settable(nfs4.fattr4(attrs.bitmap_of(numbers), vals))


def test_check_verifiable() -> None:
    attrs.check_verifiable(attrs.bitmap_of([nfs4.FATTR4_SIZE, nfs4.FATTR4_FILEHANDLE]))
    for n, status in (
        (nfs4.FATTR4_ACL, nfs4.NFS4ERR_ATTRNOTSUPP),
        (nfs4.FATTR4_RDATTR_ERROR, nfs4.NFS4ERR_INVAL),
        (nfs4.FATTR4_TIME_ACCESS_SET, nfs4.NFS4ERR_INVAL),
    ):
        with pytest.raises(Nfs4Error) as e:
            attrs.check_verifiable(attrs.bitmap_of([nfs4.FATTR4_SIZE, n]))
        assert e.value.status == status


def test_check_readable() -> None:
    attrs.check_readable(ALL_WORDS[:1])
    with pytest.raises(Nfs4Error) as e:
        attrs.check_readable(attrs.bitmap_of([nfs4.FATTR4_TIME_MODIFY_SET]))
    assert e.value.status == nfs4.NFS4ERR_INVAL


READABLE = sorted(attrs.SUPPORTED - attrs.WRITE_ONLY)


@settings(max_examples=300, deadline=None)
@given(numbers=st.sets(st.sampled_from(READABLE), max_size=20))
def test_any_mask_encodes_as_its_attributes_one_by_one(numbers: set[int]) -> None:
    """Whatever groups or generated encoder code a mask, the values are each attribute's own
    encoding, in attribute order."""
    fs = FS
    f = attrs.encode_attrs(attrs.bitmap_of(numbers), ATTRS, fs, FH, CONFIG, nfs4.NFS4ERR_IO)
    one_by_one = [
        attrs.encode_attrs(attrs.bitmap_of([n]), ATTRS, fs, FH, CONFIG, nfs4.NFS4ERR_IO).attr_vals
        for n in sorted(numbers)
    ]
    assert f.attr_vals == b"".join(one_by_one)
    assert attrs.attr_numbers(f.attrmask) == sorted(numbers)


def test_generated_mask_encoders_agree_with_the_groups() -> None:
    cache = EncoderCache(attrs.SUPPORTED)
    for key in nfs4.ATTRIBUTE_MASK_ENCODERS:
        generated = cache._compile(key)
        grouped = cache._compile(key, specialised=False)
        assert generated.fn is nfs4.ATTRIBUTE_MASK_ENCODERS[key]
        assert generated.fn is not grouped.fn
        for err in (0, nfs4.NFS4ERR_ACCESS):
            assert generated.encode(ATTRS, FS, FH, CONFIG, err) == grouped.encode(
                ATTRS, FS, FH, CONFIG, err
            )
