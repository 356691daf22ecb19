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
        for module, text in regen.render(t).items():
            committed = Path(regen.GEN / f"{module}.py").read_text()
            assert committed == text, f"run python -m nfsrdma.xdr.regen ({module})"


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


def test_ul1_ul2_only_the_four_ddp_eligible_items_can_leave_the_stream() -> None:
    """RFC 8267 6.1: WRITE data, symlink text, READ data and READLINK text, nothing else —
    in particular nothing of the callback program, GETATTR or READDIR (UL-2)."""

    # nfs4 re-exports the codecs of its parts (regen.NFS4_PARTS): read them all.
    src = "".join(p.read_text() for p in sorted(regen.GEN.glob("*nfs4*.py")))
    assert "def enc_WRITE4args(" in src
    users = set()
    for block in src.split("\ndef ")[1:]:
        name = block.split("(", 1)[0]
        if "_DdpItem(" in block or "take_ddp(" in block:
            users.add(name)
    # The four items' codecs, and those that code them inline: the READ and READLINK result
    # unions, and the per-case encoders of WRITE, READ, READLINK and of a symlink's createtype4.
    assert users == {
        "enc_WRITE4args", "dec_WRITE4args", "enc_READ4resok", "dec_READ4resok",
        "enc_READLINK4resok", "dec_READLINK4resok",
        "enc_createtype4_linkdata", "dec_createtype4_linkdata",
        "enc_READ4res", "dec_READ4res", "enc_READLINK4res", "dec_READLINK4res",
        "_enc_nfs_argop4_38", "_enc_nfs_resop4_25", "_enc_nfs_resop4_27", "_enc_createtype4_5",
    }  # fmt: skip
    assert {
        ("WRITE4args", "data"), ("createtype4", "linkdata"),
        ("READ4resok", "data"), ("READLINK4resok", "link"),
    } == regen.NFS4_DDP  # fmt: skip
