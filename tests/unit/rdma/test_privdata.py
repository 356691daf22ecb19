"""RFC 8797 private data: the PD- checks of docs/conformance.md that can run on the host."""

from __future__ import annotations

import logging
import pathlib
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nfsrdma
from nfsrdma.transport.rdma import privdata
from nfsrdma.transport.rdma.privdata import (
    Fabric,
    InlineThresholds,
    PrivateData,
    PrivateDataError,
    check_receive_provisioning,
    decode,
    decode_size,
    encode,
    encode_size,
    inline_thresholds,
    private_data_limit,
    requester_advertises_r,
    requester_expects_remote_invalidation,
    responder_advertises_r,
    responder_may_send_with_invalidate,
)

BLOCK_R1 = bytes.fromhex("f6ab0e1801010303")
KNFSD_ACCEPT = bytes.fromhex("f6ab0e1801000303")


def test_pd2_layout_encode_and_knfsd_decode() -> None:
    """PD-2: (v1, R=1, 4096/4096) encodes as f6 ab 0e 18 01 01 03 03; knfsd's accept decodes."""
    assert encode(PrivateData(4096, 4096, remote_invalidate=True)) == BLOCK_R1
    assert decode(KNFSD_ACCEPT) == PrivateData(4096, 4096, remote_invalidate=False, version=1)


def test_pd2_linux_client_connect_request_as_captured() -> None:
    """PD-2, PD-13: the Linux client's 56-octet connect request (NOTES.md) decodes."""
    assert decode(BLOCK_R1 + bytes(48)) == PrivateData(4096, 4096, remote_invalidate=True)


def test_pd3_reserved_bits_ignored_on_receipt() -> None:
    """PD-3: octet 5 = 0xFF is R=1, no error; 0xFE is R=0."""
    assert decode(bytes.fromhex("f6ab0e1801ff0303")) == PrivateData(4096, 4096, True)
    assert decode(bytes.fromhex("f6ab0e1801fe0303")) == PrivateData(4096, 4096, False)


@given(
    send=st.integers(1024, 2**20),
    receive=st.integers(1024, 2**20),
    r=st.booleans(),
)
def test_pd3_reserved_bits_always_zero_when_sent(send: int, receive: int, r: bool) -> None:
    """PD-3: encoder output always has (octet5 AND 0xFE) == 0; PD-12: block at offset 0."""
    out = encode(PrivateData(send, receive, r))
    assert out[5] & 0xFE == 0
    assert out[:4] == b"\xf6\xab\x0e\x18" and out[4] == 1


def test_pd4_unknown_version_means_defaults_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PD-4: f6 ab 0e 18 02 01 07 07 is treated as absent (1024/1024, R=0), with a warning."""
    with caplog.at_level(logging.WARNING, logger=privdata.__name__):
        peer = decode(bytes.fromhex("f6ab0e1802010707"))
    assert peer is None
    assert inline_thresholds(PrivateData(8192, 8192), peer) == InlineThresholds(1024, 1024)
    assert not responder_may_send_with_invalidate(True, peer, True)
    assert any("version 2" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("nbytes", "code"),
    [(1024, 0), (1500, 0), (4096, 3), (65536, 63), (262144, 255), (1 << 20, 255), (2047, 0)],
)
def test_pd5_encode_table(nbytes: int, code: int) -> None:
    """PD-5: rounded down, clamped to 0..255."""
    assert encode_size(nbytes) == code


@pytest.mark.parametrize(("code", "nbytes"), [(0, 1024), (3, 4096), (63, 65536), (255, 262144)])
def test_pd5_decode_table(code: int, nbytes: int) -> None:
    """PD-5: (value + 1) x 1024."""
    assert decode_size(code) == nbytes


def test_pd5_buffers_below_1024_refused() -> None:
    """PD-5: refuse to configure buffers smaller than 1024."""
    with pytest.raises(PrivateDataError):
        encode_size(1023)
    with pytest.raises(PrivateDataError):
        PrivateData.for_buffers(512, 4096)


@given(send=st.integers(1024, 2**21), receive=st.integers(1024, 2**21))
def test_pd6_advertise_only_what_is_provisioned(send: int, receive: int) -> None:
    """PD-6: the advertised sizes never exceed the buffers and survive the round trip, so every
    posted receive holds the advertised Receive Size."""
    mine = PrivateData.for_buffers(send, receive)
    assert mine.send_size <= send and mine.receive_size <= receive
    assert decode(encode(mine)) == mine
    check_receive_provisioning(mine, receive)


def test_pd6_provisioning_check_fails_on_small_receives() -> None:
    """PD-6: a receive buffer below the advertised Receive Size is a setup error."""
    with pytest.raises(PrivateDataError):
        check_receive_provisioning(PrivateData(4096, 8192), 4096)


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        (PrivateData(8192, 65536), PrivateData(4096, 4096), InlineThresholds(4096, 4096)),
        (PrivateData(8192, 65536), None, InlineThresholds(1024, 1024)),
        (None, PrivateData(4096, 4096), InlineThresholds(1024, 1024)),
        (PrivateData(65536, 2048), PrivateData(32768, 16384), InlineThresholds(16384, 2048)),
    ],
)
def test_pd7_thresholds_per_direction(
    client: PrivateData | None, server: PrivateData | None, expected: InlineThresholds
) -> None:
    """PD-7: c->s = min(client send, server receive); s->c = min(server send, client receive);
    PD-9: a missing block counts as 1024/1024."""
    assert inline_thresholds(client, server) == expected


@pytest.mark.parametrize(
    "received",
    [None, b"", bytes(56), bytes(range(56)), b"\xf6\xab\x0e", b"\xf6\xab\x0e\x18\x01\x01"],
)
def test_pd9_no_valid_block_means_defaults(received: bytes | None) -> None:
    """PD-9: no valid block: 1024/1024 and the responder never uses Send with Invalidate."""
    peer = decode(received)
    assert peer is None
    assert inline_thresholds(PrivateData(65536, 65536, True), peer) == InlineThresholds(1024, 1024)
    assert not responder_may_send_with_invalidate(True, peer, device_supports=True)


@pytest.mark.parametrize("offset", [0, 1, 3, 5, 48])
def test_pd10_block_found_at_any_offset(offset: int) -> None:
    """PD-10: blocks at offsets 0, 1, 3, 5 and len-8 (of a 56-octet buffer) decode."""
    buf = bytearray(56)
    buf[offset : offset + 8] = BLOCK_R1
    assert decode(bytes(buf)) == PrivateData(4096, 4096, True)


def test_pd10_identifier_overrunning_the_buffer_is_absent() -> None:
    """PD-10: an identifier starting at len-6 is treated as absent."""
    buf = bytearray(56)
    buf[50:56] = BLOCK_R1[:6]
    assert decode(bytes(buf)) is None


def test_pd10_first_valid_match_wins() -> None:
    """PD-10: first candidate version 9, second valid: the second is used."""
    buf = bytes.fromhex("f6ab0e1809010707") + bytes(3) + KNFSD_ACCEPT + BLOCK_R1
    assert decode(buf) == PrivateData(4096, 4096, False)


@pytest.mark.parametrize(
    ("fabric", "connect", "accept"),
    [(Fabric.INFINIBAND, 56, 196), (Fabric.ROCE, 56, 196), (Fabric.IWARP, 512, 512)],
)
def test_pd11_builder_refuses_extensions_beyond_the_fabric_limit(
    fabric: Fabric, connect: int, accept: int
) -> None:
    """PD-11: one test per fabric type: the builder fills exactly the room and refuses more."""
    block = PrivateData(4096, 4096)
    assert private_data_limit(fabric, accept=False) == connect
    assert private_data_limit(fabric, accept=True) == accept
    for limit in (connect, accept):
        assert len(encode(block, extension=bytes(limit - 8), limit=limit)) == limit
        with pytest.raises(PrivateDataError):
            encode(block, extension=bytes(limit - 7), limit=limit)


def test_pd12_pd20_project_data_after_octet_8_keeps_a_plain_v1_block() -> None:
    """PD-12: our block is always at offset 0; PD-20: a plain v1 decoder still reads extended
    private data as v1 (as Linux does: the first eight octets only)."""
    out = encode(PrivateData(8192, 16384, True), extension=b"\xf6\xab\x0e\x18\x09project")
    assert out[:8] == bytes.fromhex("f6ab0e180101070f")
    assert decode(out) == PrivateData(8192, 16384, True)
    assert decode(out[:8]) == decode(out)


def test_pd13_padding_tolerated() -> None:
    """PD-13: a 56-octet buffer (block then zeros) and an exact 8-octet buffer both decode."""
    assert decode(KNFSD_ACCEPT + bytes(48)) == decode(KNFSD_ACCEPT) == PrivateData(4096, 4096)
    assert decode(memoryview(KNFSD_ACCEPT + bytes(188))) == PrivateData(4096, 4096)


@pytest.mark.parametrize(
    ("ours", "peer_r", "device", "expected"),
    [
        (True, True, True, True),
        (True, False, True, False),
        (False, True, True, False),
        (True, True, False, False),
        (False, False, True, False),
    ],
)
def test_pd15_pd16_responder_decision_table(
    ours: bool, peer_r: bool, device: bool, expected: bool
) -> None:
    """PD-15/PD-16: Send with Invalidate only when both set R and the device supports it."""
    peer = decode(encode(PrivateData(remote_invalidate=peer_r)))
    assert responder_may_send_with_invalidate(ours, peer, device) is expected


def test_pd16_responder_advertises_r_only_with_device_support() -> None:
    """PD-16: capability missing or disabled by config: R=0."""
    assert responder_advertises_r(True)
    assert not responder_advertises_r(False)
    assert not responder_advertises_r(True, enabled=False)


def test_pd17_requester_sets_r_only_for_windows() -> None:
    """PD-17 (a): R only if every exposed STag is a per-RPC memory window."""
    assert requester_advertises_r(every_stag_is_window=True)
    assert not requester_advertises_r(every_stag_is_window=False)
    assert not requester_advertises_r(True, enabled=False)


@pytest.mark.parametrize("server_r", [True, False, None])
def test_pd18_requester_expects_invalidation_whatever_the_server_said(
    server_r: bool | None,
) -> None:
    """PD-18: knfsd advertises R=0 yet invalidates: a client that set R expects it anyway;
    our server, by contrast, never invalidates toward a peer that cleared R."""
    peer = None if server_r is None else PrivateData(remote_invalidate=server_r)
    assert requester_expects_remote_invalidation(True, peer)
    assert not requester_expects_remote_invalidation(False, peer)
    linux_client_r1 = decode(BLOCK_R1)
    assert not responder_may_send_with_invalidate(False, linux_client_r1, True)


@settings(max_examples=500)
@given(st.binary(max_size=512))
def test_pd21_fuzz_decode_never_raises(buf: bytes) -> None:
    """PD-21: arbitrary private data never raises; a decoded block is in range."""
    peer = decode(buf)
    if peer is not None:
        assert 1024 <= peer.send_size <= 262144 and 1024 <= peer.receive_size <= 262144


@settings(max_examples=500)
@given(
    buf=st.binary(max_size=200).flatmap(
        lambda b: st.integers(0, len(b)).map(lambda i: b[:i] + BLOCK_R1[: (len(b) - i) % 9] + b[i:])
    ),
    send=st.integers(1024, 2**20),
    receive=st.integers(1024, 2**20),
)
def test_pd21_fuzz_thresholds_within_local_buffers(buf: bytes, send: int, receive: int) -> None:
    """PD-21: negotiated thresholds never exceed local buffer sizes, in either role."""
    mine = PrivateData.for_buffers(send, receive)
    peer = decode(buf)
    as_client = inline_thresholds(mine, peer)
    assert as_client.client_to_server <= send and as_client.server_to_client <= receive
    as_server = inline_thresholds(peer, mine)
    assert as_server.server_to_client <= send and as_server.client_to_server <= receive


def test_pd21_one_hundred_thousand_random_buffers() -> None:
    """PD-21: 10^5 random buffers (a quarter seeded with identifier fragments): no exception,
    thresholds within the local 4096/8192 buffers."""
    rng = random.Random(8797)
    mine = PrivateData.for_buffers(4096, 8192)
    ident = BLOCK_R1[:4]
    for i in range(100_000):
        buf = bytearray(rng.randbytes(rng.randrange(0, 200)))
        if i % 4 == 0 and len(buf) >= 4:
            at = rng.randrange(0, len(buf) - 3)
            buf[at : at + 4] = ident
        peer = decode(bytes(buf))
        t = inline_thresholds(mine, peer)
        assert t.client_to_server <= 4096 and t.server_to_client <= 8192


def test_pd22_identifier_defined_in_exactly_one_place() -> None:
    """PD-22: the constant is defined once in the package, in privdata.py, which notes the
    IANA registry."""
    root = pathlib.Path(nfsrdma.__file__).parent
    definition = re.compile(r"=\s*0xf6ab0e18\b", re.IGNORECASE)
    hits = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if definition.search(p.read_text(encoding="utf-8"))
    ]
    assert hits == ["transport/rdma/privdata.py"]
    assert privdata.FORMAT_IDENTIFIER == 0xF6AB0E18
    # The module's docstring, from its source (a compiled module has no ``__doc__``).
    source = (root / "transport/rdma/privdata.py").read_text(encoding="utf-8")
    doc = source.split('"""')[1]
    assert "RDMA-CM Private Data Identifiers" in " ".join(doc.split())
