"""The XDR compiler: language coverage, exact encodings, bounds, DDP items, robustness."""

from __future__ import annotations

import contextlib
import struct
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.xdr.codegen import Options, generate
from nfsrdma.xdr.fattrgen import FattrTable, section
from nfsrdma.xdr.parser import XdrSyntaxError, parse
from nfsrdma.xdr.runtime import Reader, Writer, XdrError, pack, unpack
from tests.unit.xdr.strategies import Strategies, codec, type_names

SPEC = """
/* every construct of RFC 4506 the project uses */
const MAXNAME = 8;
const BIG = 0x10;
%passthrough lines are ignored
enum color { RED = 0, GREEN = 1, BLUE = 5 };
typedef opaque verifier[8];
typedef unsigned int bitmap<>;
typedef string name<MAXNAME>;
typedef hyper offset_t;
struct pair { int a; unsigned int b; };
struct fixedmix { unsigned hyper h; verifier v; bool flag; color c; pair p; int arr[3]; };
struct varied {
    unsigned int id;
    opaque blob<BIG>;
    name label;
    bitmap mask;
    pair pairs<2>;
    pair *maybe;
    offset_t where;
    opaque tail[3];
};
struct node { name key; unsigned int val; node *next; };
struct one { unsigned int only; one *next; };
struct holder { node *items; one *ids; bool done; };
union pick switch (color c) {
    case RED: pair p;
    case GREEN: case BLUE: opaque raw<4>;
};
union maybe switch (unsigned int kind) {
    case 1: void;
    case 2: unsigned hyper big;
    default: name other;
};
union flagged switch (bool on) { case TRUE: int n; case FALSE: void; };
struct payload { unsigned int count; opaque data<>; };
union plus switch (int tag) { case 1: payload pl; case 2: opaque link<>; };
program DEMO { version DEMOV { void DNULL(void) = 0; varied DGET(pair) = 1; } = 2; } = 400123;
"""


def _compile(text: str, ddp: set[tuple[str, str]] | None = None) -> types.ModuleType:
    mod = types.ModuleType("xdr_test_module")
    src = generate(parse(text), Options(ddp_fields=ddp or set()))
    sys.modules[mod.__name__] = mod  # dataclasses resolve annotations via sys.modules
    exec(compile(src, "<generated>", "exec"), mod.__dict__)
    return mod


SPEC_AST = parse(SPEC)
M = _compile(SPEC, {("payload", "data"), ("plus", "link")})
S = Strategies(SPEC_AST, M)


def test_constants_and_program_numbers() -> None:
    assert (M.MAXNAME, M.BIG, M.BLUE) == (8, 16, 5)
    assert (M.DEMO, M.DEMOV, M.DGET) == (400123, 2, 1)
    assert isinstance(M.color.BLUE, int)


def test_syntax_errors_carry_line_numbers() -> None:
    with pytest.raises(XdrSyntaxError, match="line 2"):
        parse("const A = 1;\nstruct x { int };")
    with pytest.raises(XdrSyntaxError, match="unknown type"):
        parse("struct x { nosuch y; };")
    with pytest.raises(XdrSyntaxError, match="unknown value"):
        parse("typedef opaque x<NOPE>;")
    with pytest.raises(XdrSyntaxError, match="anonymous"):
        parse("struct x { struct { int a; } y; };")
    with pytest.raises(XdrSyntaxError, match="duplicate case"):
        parse("union u switch (int d) { case 1: int a; case 1: int b; };")


def test_exact_encoding_of_a_mixed_struct() -> None:
    v = M.varied(
        id=7,
        blob=b"\x01\x02\x03",
        label="ab",
        mask=[1, 2],
        pairs=[M.pair(-1, 2)],
        maybe=None,
        where=-2,
        tail=b"xyz",
    )
    expected = (
        struct.pack(">I", 7)
        + struct.pack(">I", 3)
        + b"\x01\x02\x03\x00"
        + struct.pack(">I", 2)
        + b"ab\x00\x00"
        + struct.pack(">III", 2, 1, 2)
        + struct.pack(">Iii", 1, -1, 2)
        + struct.pack(">I", 0)
        + struct.pack(">q", -2)
        + b"xyz\x00"
    )
    assert pack(M.enc_varied, v) == expected
    assert unpack(M.dec_varied, expected) == v


def test_fixed_struct_is_one_layout() -> None:
    v = M.fixedmix(2**64 - 1, b"8bytes!!", True, M.BLUE, M.pair(3, 4), [1, 2, 3])
    data = pack(M.enc_fixedmix, v)
    assert len(data) == 8 + 8 + 4 + 4 + 8 + 12
    assert unpack(M.dec_fixedmix, data) == v


def test_linked_lists_become_python_lists() -> None:
    h = M.holder(items=[M.node("a", 1), M.node("b", 2)], ids=[5, 6, 7], done=True)
    data = pack(M.enc_holder, h)
    # items: TRUE a 1 TRUE b 2 FALSE; ids: TRUE 5 TRUE 6 TRUE 7 FALSE; done
    assert data.count(struct.pack(">I", 1)) >= 1
    assert unpack(M.dec_holder, data) == h


def test_long_linked_list_decodes_without_recursion() -> None:
    n = 20000
    body = b"".join(struct.pack(">II", 1, i) for i in range(n)) + struct.pack(">I", 0)
    data = struct.pack(">I", 0) + body + struct.pack(">I", 1)
    h = unpack(M.dec_holder, data)
    assert h.ids == list(range(n)) and h.items == [] and h.done is True


def test_unions_dispatch_validate_and_default() -> None:
    assert pack(M.enc_pick, M.pick(M.RED, M.pair(1, 2))) == struct.pack(">iii", 0, 1, 2)
    assert unpack(M.dec_pick, struct.pack(">iI", 5, 1) + b"z\0\0\0") == M.pick(M.BLUE, b"z")
    with pytest.raises(XdrError, match="not a case of pick"):
        unpack(M.dec_pick, struct.pack(">i", 3))  # not a color at all
    assert unpack(M.dec_maybe, struct.pack(">I", 1)) == M.maybe(1, None)
    other = unpack(M.dec_maybe, struct.pack(">II", 99, 1) + b"q\0\0\0")
    assert other == M.maybe(99, "q")
    with pytest.raises(XdrError):
        unpack(M.dec_flagged, struct.pack(">I", 2))  # a bool must be 0 or 1


def test_enums_reject_unknown_values_both_ways() -> None:
    with pytest.raises(XdrError, match="color"):
        unpack(M.dec_color, struct.pack(">i", 2))
    with pytest.raises(XdrError):
        pack(M.enc_color, 2)


def test_bounds_are_checked_before_allocation() -> None:
    # A name longer than MAXNAME, on decode and on encode.
    with pytest.raises(XdrError, match="exceeds 8"):
        unpack(M.dec_name, struct.pack(">I", 9) + b"x" * 12)
    with pytest.raises(XdrError):
        pack(M.enc_name, "x" * 9)
    # An unbounded array claiming 2**32-1 elements in a 12-byte message fails at once.
    with pytest.raises(XdrError, match="remaining input"):
        unpack(M.dec_bitmap, struct.pack(">III", 0xFFFFFFFF, 1, 2))
    with pytest.raises(XdrError, match="fixed opaque"):
        pack(M.enc_verifier, b"short")


def test_integer_arrays_of_every_length() -> None:
    """Arrays of unsigned ints (bitmaps) use precompiled layouts up to runtime.U32_ARRAYS and
    struct's otherwise: the same bytes and values either way, and the same errors."""
    for n in (0, 1, 2, 7, 8, 9, 10, 40):
        words = [(i * 2654435761) & 0xFFFFFFFF for i in range(n)]
        data = struct.pack(f">I{n}I", n, *words)
        assert pack(M.enc_bitmap, words) == data
        assert unpack(M.dec_bitmap, data) == words
        if n:
            with pytest.raises(XdrError, match="remaining input"):
                unpack(M.dec_bitmap, data[:-4])
            with pytest.raises(XdrError):
                pack(M.enc_bitmap, [*words[:-1], 1 << 32])
            with pytest.raises(XdrError):
                pack(M.enc_bitmap, [*words[:-1], None])


def test_truncation_and_trailing_bytes() -> None:
    data = pack(M.enc_varied, M.varied(1, b"", "", [], [], None, 0, b"abc"))
    for cut in range(len(data)):
        with pytest.raises(XdrError):
            unpack(M.dec_varied, data[:cut])
    with pytest.raises(XdrError, match="trailing"):
        unpack(M.dec_varied, data + b"\0\0\0\0")


def test_error_offsets_point_at_the_bad_item() -> None:
    # items: present, then a key whose length (9) exceeds MAXNAME, at offset 4.
    with pytest.raises(XdrError, match="exceeds 8") as e:
        unpack(M.dec_holder, struct.pack(">II", 1, 9) + b"x" * 12)
    assert e.value.offset == 4
    # ids: an empty item list, then a link word that is not a bool, at offset 12.
    with pytest.raises(XdrError, match="not a bool") as e:
        unpack(M.dec_holder, struct.pack(">III", 0, 1, 9) + b"xxxx")
    assert e.value.offset == 12


def test_ddp_items_are_kept_aside_and_spliced() -> None:
    w = Writer()
    w.ddp_tag = 4
    M.enc_payload(w, M.payload(2, b"hello"))
    assert bytes(w) == struct.pack(">II", 2, 5)  # the data is not in the stream
    (item,) = w.ddp
    assert (item.offset, bytes(item.data), item.tag) == (8, b"hello", 4)
    assert w.flatten() == struct.pack(">II", 2, 5) + b"hello\0\0\0"
    assert w.stream_position(item) == 8
    # Inline decoding gives a zero-copy view of the input.
    v = unpack(M.dec_payload, w.flatten())
    assert isinstance(v.data, memoryview) and v.data == b"hello"


def test_ddp_decode_takes_data_from_its_chunk() -> None:
    w = Writer()
    M.enc_plus(w, M.plus(1, M.payload(9, b"abcdef")))
    M.enc_plus(w, M.plus(2, b"xy"))
    inline = bytes(w)
    first, second = w.ddp
    chunks = {w.stream_position(first): b"abcdef\0\0", w.stream_position(second): b"xy"}
    r = Reader(inline, chunks)
    v1, off = M.dec_plus(r, 0)
    v2, off = M.dec_plus(r, off)
    assert off == len(inline)
    assert v1 == M.plus(1, M.payload(9, b"abcdef")) and v2 == M.plus(2, b"xy")
    # A chunk shorter than the length the stream announces is malformed.
    with pytest.raises(XdrError, match="chunk"):
        M.dec_plus(Reader(inline, {w.stream_position(first): b"abc"}), 0)


@pytest.mark.parametrize("name", type_names(SPEC_AST))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(name: str, data: st.DataObject) -> None:
    enc, dec = codec(M, name)
    value = data.draw(S.for_type(name))
    encoded = pack(enc, value)
    assert len(encoded) % 4 == 0
    decoded = unpack(dec, encoded)
    assert decoded == value
    assert pack(enc, decoded) == encoded


@pytest.mark.parametrize("name", type_names(SPEC_AST))
@settings(max_examples=60, deadline=None)
@given(blob=st.binary(max_size=96))
def test_random_bytes_only_raise_xdr_error(name: str, blob: bytes) -> None:
    _, dec = codec(M, name)
    with contextlib.suppress(XdrError):
        unpack(dec, blob)


# -- attribute-mask codecs (fattrgen) -----------------------------------------------------
ATTR_SPEC = """
const FATTR4_SIZE = 4;
const FATTR4_FSID = 8;
const FATTR4_OWNER = 36;
const FATTR4_UNKNOWN = 40;
struct fsid4 { unsigned hyper major; unsigned hyper minor; };
typedef unsigned hyper fattr4_size;
typedef fsid4 fattr4_fsid;
typedef opaque fattr4_owner<>;
"""


def _attr_module(table: FattrTable) -> types.ModuleType:
    mod = types.ModuleType("xdr_attr_test_module")
    src = generate(parse(ATTR_SPEC), Options(sections=(section(table),)))
    sys.modules[mod.__name__] = mod
    exec(compile(src, "<generated>", "exec"), mod.__dict__)
    return mod


def test_attribute_table_is_checked_against_the_spec() -> None:
    with pytest.raises(ValueError, match="gives 1 values, fattr4_fsid holds 2"):
        _attr_module(FattrTable(fixed={"fsid": "a.fsid"}, variable={}, bitmaps={}))
    with pytest.raises(ValueError, match="no attribute fattr4_mode"):
        _attr_module(FattrTable(fixed={"mode": "a.mode"}, variable={}, bitmaps={}))
    with pytest.raises(ValueError, match="not of fixed size"):
        _attr_module(FattrTable(fixed={"owner": "a.uid"}, variable={}, bitmaps={}))


def test_attribute_mask_codecs_from_a_table() -> None:
    table = FattrTable(
        fixed={"size": "a.size", "fsid": "*a.fsid #2"},
        variable={"owner": "_fattr4_decimal(a.uid)"},
        bitmaps={},
        masks={"all": ("size", "fsid", "owner"), "unknown": ("size", "unknown")},
        group_size=2,
    )
    m = _attr_module(table)
    a = types.SimpleNamespace(size=7, fsid=(1, 2), uid=1000)
    key = (1 << 4 | 1 << 8, 1 << 4)
    expected = struct.pack(">QQQ", 7, 1, 2) + struct.pack(">I", 4) + b"1000"
    assert m.ATTRIBUTE_MASK_ENCODERS[key](a, None, b"", None, 0) == expected
    assert m.ATTRIBUTE_MASK_DECODERS[key](expected) == {4: 7, 8: m.fsid4(1, 2), 36: b"1000"}
    # No decoder for a mask with an attribute that has no codec; groups of two cover the rest.
    assert list(m.ATTRIBUTE_MASK_DECODERS) == [key]
    group_of, groups = m.SERVER_ATTRIBUTE_LAYERS[-1]
    assert group_of == {4: (0, 1), 8: (0, 2), 36: (1, 1)}
    assert groups[0][3](a, None, b"", None, 0) == expected[:24]
    assert m.ATTRIBUTE_FIXED[8][0] == "QQ" and m.ATTRIBUTE_NAMES[40] == "unknown"
