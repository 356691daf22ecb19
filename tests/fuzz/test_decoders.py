"""Decoder fuzzing: random and mutated input to the RPC, NFSv4.1 COMPOUND and RPC-over-RDMA
decoders. Only XdrError may come out; nothing hangs; memory stays proportional to the input."""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.rpc import message
from nfsrdma.xdr.gen import nfs4, rpc, rpcrdma
from nfsrdma.xdr.runtime import Reader, XdrError, pack, unpack
from tests.unit.xdr.test_generated import STRATEGIES

Decoder = Callable[[Reader, int], tuple[Any, int]]

TARGETS: dict[str, tuple[str, Any, Decoder]] = {
    "rpc_msg": ("rpc", rpc.enc_rpc_msg, rpc.dec_rpc_msg),
    "COMPOUND4args": ("nfs4", nfs4.enc_COMPOUND4args, nfs4.dec_COMPOUND4args),
    "COMPOUND4res": ("nfs4", nfs4.enc_COMPOUND4res, nfs4.dec_COMPOUND4res),
    "CB_COMPOUND4args": ("nfs4", nfs4.enc_CB_COMPOUND4args, nfs4.dec_CB_COMPOUND4args),
    "CB_COMPOUND4res": ("nfs4", nfs4.enc_CB_COMPOUND4res, nfs4.dec_CB_COMPOUND4res),
    "rdma_msg": ("rpcrdma", rpcrdma.enc_rdma_msg, rpcrdma.dec_rdma_msg),
}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def _decode(dec: Decoder, data: bytes) -> None:
    with contextlib.suppress(XdrError):
        unpack(dec, data)


@st.composite
def mutated(draw: st.DrawFn, name: str) -> bytes:
    """A valid encoding with a few words overwritten (often with huge lengths), or cut short."""
    module, enc, _ = TARGETS[name]
    data = bytearray(pack(enc, draw(STRATEGIES[module].for_type(name))))
    for _ in range(draw(st.integers(1, 4))):
        if len(data) < 4:
            break
        i = draw(st.integers(0, len(data) // 4 - 1)) * 4
        word = draw(st.sampled_from([0, 1, 2, 0x7FFFFFFF, 0xFFFFFFFF, 0x10000, 53, 10044]))
        data[i : i + 4] = word.to_bytes(4, "big")
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@pytest.mark.parametrize("name", list(TARGETS))
@SETTINGS
@given(blob=st.binary(max_size=512))
def test_random_bytes(name: str, blob: bytes) -> None:
    _decode(TARGETS[name][2], blob)


@pytest.mark.parametrize("name", list(TARGETS))
@SETTINGS
@given(data=st.data())
def test_mutated_messages(name: str, data: st.DataObject) -> None:
    _decode(TARGETS[name][2], data.draw(mutated(name)))


@SETTINGS
@given(blob=st.binary(min_size=8, max_size=256))
def test_call_header_decoder(blob: bytes) -> None:
    call = (0x42).to_bytes(4, "big") + (0).to_bytes(4, "big") + blob
    with contextlib.suppress(XdrError):
        message.decode_call(Reader(call))


@pytest.mark.parametrize("name", list(TARGETS))
def test_huge_counts_are_refused_quickly_and_cheaply(name: str) -> None:
    """Every word set to 0xFFFFFFFF or 0x7FFFFFFF: no allocation proportional to the claims."""
    dec = TARGETS[name][2]
    for word in (0xFFFFFFFF, 0x7FFFFFFF, 0x00010000):
        blob = word.to_bytes(4, "big") * 16384  # 64 KiB of large counts
        tracemalloc.start()
        t0 = time.perf_counter()
        _decode(dec, blob)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < 2.0
        assert peak < 16 * len(blob) + (1 << 20)
