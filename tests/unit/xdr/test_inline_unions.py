"""The unions' fast codecs against their dictionary-driven reference, on every union of every
specification: small unions are coded inline case by case (``enc_U`` / ``dec_U``), large ones
encode through one encoder per case (``_U_ENCX``); ``_enc_any_U`` and, for small unions,
``_dec_any_U`` are the generic codecs they must agree with, byte for byte and error for error,
on valid values, on values whose discriminant is no case, and on mutated encodings."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.xdr.ast import Union
from nfsrdma.xdr.codegen import SMALL_UNION_CASES, pyname
from nfsrdma.xdr.runtime import Reader, XdrError, pack
from tests.unit.xdr.test_generated import MODULES, SPECS, STRATEGIES

UNIONS = [
    (module, name)
    for module, spec in SPECS.items()
    for name, t in spec.types.items()
    if isinstance(t, Union)
]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
WORDS = [0, 1, 2, 3, 4, 5, 22, 25, 53, 10044, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF]


def _encode(enc: Any, value: Any) -> bytes | str:
    try:
        return pack(enc, value)
    except XdrError:
        return "XdrError"


def _decode(dec: Any, data: bytes) -> tuple[Any, int] | str:
    try:
        value, end = dec(Reader(data), 0)
    except XdrError:
        return "XdrError"
    return value, end


def test_small_and_large_unions_are_both_present() -> None:
    cases = [sum(len(a.cases) for a in SPECS[m].types[n].arms) for m, n in UNIONS]  # type: ignore[union-attr]
    assert any(c <= SMALL_UNION_CASES for c in cases)
    assert any(c > SMALL_UNION_CASES for c in cases)
    assert hasattr(MODULES["nfs4"], "_nfs_resop4_ENCX")
    assert hasattr(MODULES["nfs4"], "_dec_any_READ4res")


@pytest.mark.parametrize(("module", "name"), UNIONS)
@SETTINGS
@given(data=st.data())
def test_fast_union_codecs_agree_with_the_reference(
    module: str, name: str, data: st.DataObject
) -> None:
    mod = MODULES[module]
    union = SPECS[module].types[name]
    assert isinstance(union, Union)
    enc, ref_enc = getattr(mod, f"enc_{name}"), getattr(mod, f"_enc_any_{name}")
    value = data.draw(STRATEGIES[module].for_type(name))
    encoded = _encode(enc, value)
    assert encoded == _encode(ref_enc, value)
    # A discriminant that may be no case at all: the same bytes or the same refusal.
    other = data.draw(st.sampled_from(WORDS))
    try:
        odd = dataclasses.replace(value, **{pyname(union.discriminant.name): other})
    except TypeError:  # the compiled build's classes take only enum members for an enum
        pass
    else:
        assert _encode(enc, odd) == _encode(ref_enc, odd)
    ref_dec = getattr(mod, f"_dec_any_{name}", None)
    if ref_dec is None:  # a large union decodes through its dictionary only
        return
    assert isinstance(encoded, bytes)
    blob = bytearray(encoded)
    for _ in range(data.draw(st.integers(0, 3))):
        if len(blob) < 4:
            break
        i = data.draw(st.integers(0, len(blob) // 4 - 1)) * 4
        blob[i : i + 4] = data.draw(st.sampled_from(WORDS)).to_bytes(4, "big")
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    dec = getattr(mod, f"dec_{name}")
    assert _decode(dec, bytes(blob)) == _decode(ref_dec, bytes(blob))
