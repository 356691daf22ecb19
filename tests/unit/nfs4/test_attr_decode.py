"""The compiled fattr4 decoder gives exactly what the generated per-attribute codecs give."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4.attr_decode import NAMES, decode_values, mask_numbers, plan
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer, XdrError
from tests.unit.xdr.test_generated import STRATEGIES

NFS4 = STRATEGIES["nfs4"]
DECODABLE = sorted(n for n in NAMES if hasattr(nfs4, f"enc_fattr4_{NAMES[n]}"))


def _fattr(values: dict[int, Any]) -> nfs4.fattr4:
    w = Writer()
    mask: list[int] = []
    for n in sorted(values):
        getattr(nfs4, f"enc_fattr4_{NAMES[n]}")(w, values[n])
        while len(mask) <= n >> 5:
            mask.append(0)
        mask[n >> 5] |= 1 << (n & 31)
    return nfs4.fattr4(mask, w.flatten())


@st.composite
def attr_values(draw: st.DrawFn) -> dict[int, Any]:
    chosen = draw(st.sets(st.sampled_from(DECODABLE), max_size=12))
    return {n: draw(NFS4.for_type(f"fattr4_{NAMES[n]}")) for n in chosen}


@settings(max_examples=300, deadline=None)
@given(values=attr_values())
def test_matches_the_generated_codecs(values: dict[int, Any]) -> None:
    assert decode_values(_fattr(values)) == values


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_fixed_table_agrees_with_the_spec(data: st.DataObject) -> None:
    """Every attribute the decoder treats as fixed-size encodes to exactly its format's size."""
    for n, (fmt, _) in nfs4.ATTRIBUTE_FIXED.items():
        value = data.draw(NFS4.for_type(f"fattr4_{NAMES[n]}"))
        w = Writer()
        getattr(nfs4, f"enc_fattr4_{NAMES[n]}")(w, value)
        assert len(w) == struct.calcsize(">" + fmt), NAMES[n]


@pytest.mark.parametrize("cut", [1, 4, 7])
def test_truncated_or_padded_values_are_xdr_errors(cut: int) -> None:
    f = _fattr({nfs4.FATTR4_SIZE: 5, nfs4.FATTR4_OWNER: b"1000", nfs4.FATTR4_MODE: 0o644})
    with pytest.raises(XdrError):
        decode_values(nfs4.fattr4(f.attrmask, f.attr_vals[:-cut]))
    with pytest.raises(XdrError):
        decode_values(nfs4.fattr4(f.attrmask, f.attr_vals + b"\0" * 4))
    with pytest.raises(XdrError):  # type 9 does not exist
        decode_values(nfs4.fattr4([1 << nfs4.FATTR4_TYPE], b"\0\0\0\x0a"))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_generated_mask_decoders_agree_with_the_plans(data: st.DataObject) -> None:
    """Each mask with its own generated decoder decodes as the generic plan and as the
    per-attribute codecs do."""
    for key, generated in nfs4.ATTRIBUTE_MASK_DECODERS.items():
        values = {n: data.draw(NFS4.for_type(f"fattr4_{NAMES[n]}")) for n in mask_numbers(key)}
        f = _fattr(values)
        assert tuple(f.attrmask) == key
        assert generated(f.attr_vals) == values
        assert plan(key, specialised=False)(f.attr_vals) == values
        with pytest.raises(XdrError):
            generated(f.attr_vals + bytes(4))


LAYER0 = sorted(nfs4.ATTRIBUTE_DECODE_LAYERS[0][0])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_masks_of_the_first_layer_decode_group_by_group(data: st.DataObject) -> None:
    """Any mask of the attributes the Linux client combines (not only the listed masks) is
    decoded by the generated group decoders, to what the per-attribute codecs give."""
    chosen = data.draw(st.sets(st.sampled_from(LAYER0), min_size=1))
    values = {n: data.draw(NFS4.for_type(f"fattr4_{NAMES[n]}")) for n in chosen}
    f = _fattr(values)
    decoder = plan(f.attrmask)
    assert decoder(f.attr_vals) == values
    assert plan(f.attrmask, specialised=False)(f.attr_vals) == values
    with pytest.raises(XdrError):
        decoder(f.attr_vals + bytes(4))
    with pytest.raises(XdrError):
        decoder(f.attr_vals[:-1])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_mask_decoders_reject_what_the_plans_reject(data: st.DataObject) -> None:
    """Cut or corrupted values: each generated mask decoder fails (XdrError) exactly where the
    generic plan fails, and otherwise gives its values, from bytes or any other buffer."""
    for key, generated in nfs4.ATTRIBUTE_MASK_DECODERS.items():
        values = {n: data.draw(NFS4.for_type(f"fattr4_{NAMES[n]}")) for n in mask_numbers(key)}
        raw = bytearray(_fattr(values).attr_vals)
        if raw and data.draw(st.booleans()):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        raw = raw[: data.draw(st.integers(0, len(raw)))]
        generic = plan(key, specialised=False)
        try:
            expected = generic(bytes(raw))
        except XdrError:
            for buf in (bytes(raw), raw, memoryview(raw)):
                with pytest.raises(XdrError):
                    generated(buf)
        else:
            for buf in (bytes(raw), raw, memoryview(raw)):
                assert generated(buf) == expected
