"""Every type of every committed specification round-trips, and the modules are current."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.xdr import regen
from nfsrdma.xdr.parser import parse
from nfsrdma.xdr.runtime import pack, unpack
from tests.unit.xdr.strategies import Strategies, codec, type_names

SPECS = {t.module: parse((regen.SPECS / t.spec).read_text()) for t in regen.TARGETS}
MODULES = {name: importlib.import_module(f"nfsrdma.xdr.gen.{name}") for name in SPECS}
STRATEGIES = {name: Strategies(SPECS[name], MODULES[name]) for name in SPECS}
CASES = [(m, t) for m, spec in SPECS.items() for t in type_names(spec)]


def test_generated_modules_are_current() -> None:
    for t in regen.TARGETS:
        committed = Path(regen.GEN / f"{t.module}.py").read_text()
        assert committed == regen.render(t), f"run python -m nfsrdma.xdr.regen ({t.module})"


@pytest.mark.parametrize(("module", "name"), CASES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(module: str, name: str, data: st.DataObject) -> None:
    enc, dec = codec(MODULES[module], name)
    value = data.draw(STRATEGIES[module].for_type(name))
    encoded = pack(enc, value)
    assert len(encoded) % 4 == 0
    decoded = unpack(dec, encoded)
    assert decoded == value
    assert pack(enc, decoded) == encoded
