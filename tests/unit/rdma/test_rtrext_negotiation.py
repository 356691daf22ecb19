"""rtrext negotiation in CM private data (RT-X1, RT-1, RT-2, RT-4, RT-5, RT-17, PD-10, PD-20,
SEC-4): the codec of our block, the decision, and the matrix on the in-process provider."""

from __future__ import annotations

import random

import pytest

from nfsrdma.transport.rdma import privdata, rtrext
from nfsrdma.transport.rdma.endpoint import RdmaOptions
from nfsrdma.transport.rdma.provider import IB_CONNECT_PRIVATE_DATA_MAX
from nfsrdma.transport.rdma.rtrext import RtrBlock, Rtrs, decode, negotiate
from tests.unit.rdma.test_rpc_rdma import rig

V1 = privdata.PrivateData(4096, 4096)


def ours(block: RtrBlock | None = None) -> bytes:
    return rtrext.private_data(V1, block or RtrBlock(), limit=IB_CONNECT_PRIVATE_DATA_MAX)


def test_rtx1_block_fits_the_ib_connect_request_and_round_trips() -> None:
    block = RtrBlock(Rtrs.XREQ | Rtrs.XCONT, 5, 3, 8192, 64, 2)
    pd = ours(block)
    assert len(pd) == 28 <= IB_CONNECT_PRIVATE_DATA_MAX
    padded = pd + bytes(IB_CONNECT_PRIVATE_DATA_MAX - len(pd))  # IB pads the REQ
    assert decode(padded) == block
    assert pd[8:12] == b"NFXR"


def test_pd20_pd10_a_plain_v1_decoder_still_finds_its_block_at_offset_0() -> None:
    """Linux reads the first 8 octets as the v1 struct: ours are an unchanged v1 block."""
    pd = ours()
    assert pd[:8] == privdata.encode(V1)
    assert pd[:4] == bytes.fromhex("f6ab0e18") and pd[4] == 1 and pd[5] & 0xFE == 0
    assert privdata.decode(pd) == V1
    assert privdata.decode(pd + bytes(20)) == V1


def test_rt1_a_peer_sending_only_the_8_octet_block_gets_v1() -> None:
    linux_like = privdata.encode(V1) + bytes(IB_CONNECT_PRIVATE_DATA_MAX - 8)
    assert decode(linux_like) is None
    assert decode(privdata.encode(V1)) is None
    assert negotiate(RtrBlock(), decode(linux_like)) == rtrext.OFF


def test_sec4_the_block_counts_only_right_after_a_valid_v1_block() -> None:
    block = RtrBlock().encode()
    assert decode(bytes(8) + block) is None  # no v1 block at offset 0
    assert decode(privdata.encode(V1) + b"\0" + block) is None  # not at offset 8
    bad_version = bytearray(ours())
    bad_version[12] = 2
    assert decode(bytes(bad_version)) is None
    bad_length = bytearray(ours())
    bad_length[13] = 24
    assert decode(bytes(bad_length)) is None
    zero_limit = bytearray(ours())
    zero_limit[16:18] = b"\0\0"
    assert decode(bytes(zero_limit)) is None


def test_sec4_random_buffers_never_raise_and_rarely_enable() -> None:
    rnd = random.Random(13)
    enabled = 0
    for _ in range(20_000):
        buf = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 60)))
        block = decode(buf)
        if block is not None:
            enabled += 1
    assert enabled == 0


@pytest.mark.parametrize(
    ("local", "peer", "on"),
    [
        (RtrBlock(), RtrBlock(), True),
        (RtrBlock(), None, False),
        (None, RtrBlock(), False),
        (RtrBlock(Rtrs.XREQ | Rtrs.XRESP), RtrBlock(), False),
        (RtrBlock(), RtrBlock(Rtrs.XCONT), False),
    ],
)
def test_rt2_rt17_negotiation_matrix(
    local: RtrBlock | None, peer: RtrBlock | None, on: bool
) -> None:
    assert negotiate(local, peer).enabled is on


def test_rt4_rt5_limits_come_from_the_peer() -> None:
    state = negotiate(RtrBlock(request_limit=6), RtrBlock(request_limit=3, response_limit=1))
    assert (state.call_limit, state.reply_limit, state.accept_limit) == (3, 1, 6)
    assert state.continued_calls and not state.continued_replies


def test_pd11_the_builder_refuses_what_the_fabric_cannot_carry() -> None:
    with pytest.raises(privdata.PrivateDataError):
        rtrext.private_data(V1, RtrBlock(), limit=20)


@pytest.mark.parametrize(
    ("server_on", "client_on", "on"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
)
async def test_rtx1_matrix_on_the_inproc_provider(
    server_on: bool, client_on: bool, on: bool
) -> None:
    """ours<->ours on; a "Linux-like" side that sends only the 8-octet block turns it off for
    both, and the v1 thresholds are negotiated as before."""
    async with rig(RdmaOptions(rtrext=server_on), RdmaOptions(rtrext=client_on)) as r:
        assert r.client is not None
        server = r.server[0]
        assert r.client.rtr.enabled is on
        assert server.rtr.enabled is on
        assert r.client.thresholds.client_to_server == 4096
        assert server.thresholds.server_to_client == 4096


async def test_rt4_rt5_limits_of_1_are_carried_to_the_peer() -> None:
    server = RdmaOptions(rtr_request_limit=1, rtr_response_limit=1)
    async with rig(server, RdmaOptions()) as r:
        assert r.client is not None
        assert r.client.rtr.enabled
        assert not r.client.rtr.continued_calls and not r.client.rtr.continued_replies


@pytest.mark.parametrize(
    ("flag", "on"), [([], True), (["--rtrext"], True), (["--no-rtrext"], False)]
)
def test_rtx1_serve_flag(flag: list[str], on: bool) -> None:
    from nfsrdma.cli import build_parser

    args = build_parser().parse_args(["serve", "/tmp", *flag])
    assert args.rtrext is on


def test_rtx1_client_connect_carries_the_flag() -> None:
    import nfsrdma

    assert nfsrdma.connect("rdma://h/x", rtrext=False).rtrext is False
    assert nfsrdma.connect("rdma://h/x").rtrext is True
