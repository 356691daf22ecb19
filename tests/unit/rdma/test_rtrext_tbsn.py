"""Send-based data placement (TBSN; RT-X4, RT-14, RT-17, RT-18, RT-19, RT-20, RT-8) on the
in-process provider: the negotiation matrix, WRITE data of random sizes landing byte-exact in
the server's placement-capable receive segments with no explicit RDMA operation, each bad item
reported with its REPTERR code and the call completed over plain v1, credits and reserved
receives never overrun, the padding zero."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable

import pytest

from nfsrdma.transport.rdma import rtrext
from nfsrdma.transport.rdma import rtrheader as rh
from nfsrdma.transport.rdma.credits import CreditWindow
from nfsrdma.transport.rdma.endpoint import RdmaOptions
from nfsrdma.transport.rdma.header import RDMA_MSG
from nfsrdma.transport.rdma.marshal import CallPlan, ReadExposure
from nfsrdma.transport.rdma.rtrext_tbsn import plan_tbsn_call
from nfsrdma.xdr.gen import rpcrdma as x
from nfsrdma.xdr.runtime import Buffer
from tests.unit.rdma.helpers import Patchable
from tests.unit.rdma.test_rpc_rdma import Rig, call_write, rig
from tests.unit.rdma.test_rtrext_continuation import explicit_rdma, granted
from tests.unit.rdma.test_rtrext_errors import _corrupt_next, _decoded, _head, _rebuild, _req

E = x.optr_err
Group = list[list[Buffer]]
TBSN = RdmaOptions(rtrext_tbsn=True)


async def write_exact(r: Rig, data: bytes) -> None:
    n, digest = await call_write(r, data)
    assert n == len(data) and digest == hashlib.sha256(data).digest()


# -- negotiation (RT-17: directional, both sides must want it) -------------------------------


@pytest.mark.parametrize(
    ("server", "client", "on"),
    [
        (TBSN, TBSN, True),
        (TBSN, None, False),  # the client does not ask for it
        (None, TBSN, False),  # the server's receives have no PLT segments
        (RdmaOptions(rtrext=False, rtrext_tbsn=True), TBSN, False),  # no rtrext at all
        (TBSN, RdmaOptions(rtrext=False, rtrext_tbsn=True), False),
        (RdmaOptions(rtrext_tbsn=True, rtr_plt_segments=0), TBSN, False),
    ],
    ids=["both", "server-only", "client-only", "server-v1", "client-v1", "server-0-plt"],
)
async def test_rt17_negotiation_matrix(
    server: RdmaOptions | None, client: RdmaOptions | None, on: bool
) -> None:
    async with rig(server, client) as r:
        assert r.client is not None
        await granted(r)
        assert r.client.rtr.tbsn is on
        assert not r.server[0].rtr.tbsn  # a server never places its backward calls
        data = random.Random(1).randbytes(20_000)
        before = explicit_rdma(r)
        await write_exact(r, data)
        assert r.client.stats["rtr_tbsn_calls"] == (1 if on else 0)
        assert r.server[0].stats["rtr_tbsn_items"] == (1 if on else 0)
        assert (explicit_rdma(r) == before) is on  # off: a Read chunk (EXRW or plain v1)


@pytest.mark.parametrize("client_rtrext", [True, False])
async def test_rt17_placement_capable_receives_only_for_a_peer_that_offered_rtrext(
    client_rtrext: bool,
) -> None:
    """A server with TBSN gives a connection larger (placement-capable) receives only when
    the client sent the rtrext block; a Linux-like client keeps plain 4 KiB receives."""
    async with rig(TBSN, RdmaOptions(rtrext=client_rtrext)) as r:
        server = r.server[0]
        assert server.recv_pool.buffer_size == 4096 * (9 if client_rtrext else 1)
        assert server.local_rtr is not None
        assert server.local_rtr.plt_segments == (8 if client_rtrext else 0)
        await granted(r)
        await write_exact(r, random.Random(2).randbytes(20_000))


def test_rt3_the_block_carries_the_plt_segments_and_decides_the_send_side() -> None:
    v1 = rtrext.privdata.PrivateData(4096, 4096)
    peer = rtrext.RtrBlock(segment_size=4096, plt_segments=8)
    got = rtrext.decode(rtrext.private_data(v1, peer))
    assert got == peer
    # Our Sends hold 5 segments: we place into 4 of the peer's 8 PLT segments.
    state = rtrext.negotiate(rtrext.RtrBlock(), got, tbsn_send_room=5 * 4096)
    assert state.tbsn and (state.tbsn_segment, state.tbsn_plt) == (4096, 4)
    assert not rtrext.negotiate(rtrext.RtrBlock(), got).tbsn  # we do not want to send it
    no_plt = rtrext.RtrBlock(segment_size=4096)
    assert not rtrext.negotiate(rtrext.RtrBlock(), no_plt, tbsn_send_room=9 * 4096).tbsn


# -- placement -------------------------------------------------------------------------------


def test_rt14_segment_numbers_run_across_a_three_transmission_group() -> None:
    """Two items over three transmissions of 2 PLT segments each: numbers 0..5 in order,
    each item starting a segment, the padding between them zero."""
    a, b = b"A" * 600, b"B" * 1500
    plan = CallPlan(RDMA_MSG, [b"h" * 100], [ReadExposure(100, [a]), ReadExposure(700, [b])])
    cont = plan_tbsn_call(
        plan, segment=512, plt=2, send_limit=4096, recv_limit=4096, max_reply=0,
        call_limit=8, reply_limit=8, credits_free=8,
    )  # fmt: skip
    assert cont is not None and cont.count == 3 and cont.reads == []
    numbers = [i.xmdmi_where.value.xmdl_bsnum for i in cont.tbsn_items]  # type: ignore[union-attr]
    assert numbers == [[0, 1], [2, 3, 4]]
    areas = [b"".join(bytes(p) for p in t) for t in cont.placed]
    heads = [len(rh.encode_xmtreq(0, 0, count=0, rsbuf=0, pslen=0, dp=cont.tbsn_items))]
    heads += [rh.XMTCONT_SIZE] * 2
    for t, area in enumerate(areas):
        pad = 512 - heads[t] - sum(len(p) for p in cont.sections[t])
        assert area[:pad] == bytes(pad)  # zeros up to the end of the first segment
        areas[t] = area[pad:]
    assert areas == [a, b[:1024], b[1024:]]


async def test_rtx4_writes_of_random_sizes_land_byte_exact_without_explicit_rdma() -> None:
    rnd = random.Random(4)
    async with rig(TBSN, TBSN) as r:
        client = r.client
        assert client is not None
        await granted(r)
        sizes = [1, 4095, 4096, 4097, 8 * 1024, 32 * 1024, 128 * 1024]
        sizes += [rnd.randrange(1, 200_000) for _ in range(12)]
        for size in sizes:
            await write_exact(r, rnd.randbytes(size))
        server = r.server[0]
        placed = sum(1 for s in sizes if s > 3900)  # the small ones go inline, whole
        assert client.stats["rtr_tbsn_calls"] == placed == server.stats["rtr_tbsn_items"]
        assert explicit_rdma(r) == 0
        assert server.stats["rdma_reads"] == 0 and client.stats["registrations"] == 0


# -- errors: each bad item is reported and the call completes over plain v1 (RT-18, RT-19) ---


def _tbsn_loc(m: rh.RtrMessage) -> x.xmdp_tbsnloc:
    loc = _req(m).optxrq_dp[0].xmdmi_where.value
    assert isinstance(loc, x.xmdp_tbsnloc)
    return loc


def _bad_number(g: Group) -> Group:
    def change(m: rh.RtrMessage) -> None:
        _tbsn_loc(m).xmdl_bsnum[-1] = 99

    return [_rebuild(g[0], change), *g[1:]]


def _bad_offset(g: Group) -> Group:
    return [_rebuild(g[0], lambda m: setattr(_tbsn_loc(m), "xmdl_offset", 2)), *g[1:]]


def _too_long(g: Group) -> Group:
    def change(m: rh.RtrMessage) -> None:
        _req(m).optxrq_dp[0].xmdmi_length += 8192  # more than its segments received

    return [_rebuild(g[0], change), *g[1:]]


def _pslen(g: Group) -> Group:  # more payload than the first segment can hold
    return [_rebuild(g[0], lambda m: setattr(_req(m), "optxrq_pslen", 5000)), *g[1:]]


FAULTS: list[tuple[str, Callable[[Group], Group], int, tuple[int, int, int] | None]] = [
    ("target number", _bad_number, E.OPTRERR_BADTBSN, (99, 0, 7)),
    ("offset", _bad_offset, E.OPTRERR_BADOFF, (2, 0, 4092)),
    ("item length", _too_long, E.OPTRERR_BADPL, (20_000 + 8192, 0, 20_000)),
    ("pslen", _pslen, E.OPTRERR_BADPL, None),
]


@pytest.mark.parametrize(("name", "how", "code", "detail"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_rt18_rt19_a_bad_tbsn_item_is_reported_and_the_write_completes_over_v1(
    name: str,
    how: Callable[[Group], Group],
    code: int,
    detail: tuple[int, int, int] | None,
) -> None:
    async with rig(TBSN, TBSN, connection=Patchable) as r:
        client = r.client
        assert client is not None
        await granted(r)
        seen = _decoded(client)
        _corrupt_next(client, how)
        data = random.Random(code).randbytes(20_000)  # 5 PLT segments: one transmission
        await write_exact(r, data)
        assert [e.optre_info.optre_which for e in seen] == [code]
        info = seen[0].optre_info.value
        if detail is not None:
            assert isinstance(info, x.optr_range)
            assert (info.optrr_value, info.optrr_min, info.optrr_max) == detail
        assert client.stats["rtr_fallbacks"] == 1
        assert client.stats["read_chunks"] == 1  # the resend: plain v1 with a Read chunk
        assert r.server[0].stats["rtr_tbsn_items"] == 0 and r.server[0].stats["rtr_faults"] == 1
        await write_exact(r, data)  # placement works on afterwards
        assert r.server[0].stats["rtr_tbsn_items"] == 1
        assert client.credits.in_flight == 0


# -- credits (RT-8) and padding (RT-20) ------------------------------------------------------


async def test_rt8_tbsn_credits_are_never_overrun_and_come_back() -> None:
    """Many WRITEs of random sizes at once: each placed call holds a credit per transmission,
    never beyond the grant; the server sees no overrun; every credit and receive comes back."""
    rnd = random.Random(8)
    async with rig(RdmaOptions(credits=12, rtrext_tbsn=True), RdmaOptions(
        max_requests=12, rtrext_tbsn=True
    )) as r:  # fmt: skip
        client = r.client
        assert client is not None
        peaks: list[int] = []

        class Watched(CreditWindow):
            __slots__ = ()

            def sent(self, n: int = 1) -> None:
                super().sent(n)
                assert self.in_flight <= self.granted
                peaks.append(self.in_flight)

        client.credits = Watched(client.credits.local_max)
        await granted(r)
        for _ in range(3):
            sizes = [rnd.randrange(1, 150_000) for _ in range(16)]
            await asyncio.gather(*(write_exact(r, rnd.randbytes(n)) for n in sizes))
        server = r.server[0]
        assert client.credits.in_flight == 0 and server.stats["credit_overruns"] == 0
        assert client.stats["rtr_tbsn_calls"] > 0 and max(peaks) > 1
        posted = sum(1 for kind, _ in server._wr_ctx.values() if kind == "recv")
        assert posted == server.recv_pool.count  # every receive is posted again
        assert server._inbound_calls == 0


async def test_rt20_padding_around_placed_data_is_zero() -> None:
    """The send buffers hold old data; a placed WRITE's transmissions, captured as posted,
    have zeros from the payload's end to the first segment's end and after a short segment."""
    async with rig(TBSN, TBSN, connection=Patchable) as r:
        client = r.client
        assert client is not None
        await granted(r)
        await write_exact(r, b"\xee" * 100_000)  # dirty the send buffers
        sent: list[bytes] = []
        original = client._send_group

        def capture(transmissions: Group) -> None:
            sent.extend(b"".join(bytes(p) for p in t) for t in transmissions)
            original(transmissions)

        client._send_group = capture  # type: ignore[method-assign]
        data = b"\xff" * 50_001
        await write_exact(r, data)
        seg = 4096
        placed = b""
        for raw in sent:
            m = rh.parse(raw)
            assert raw[m.size + m.pslen : seg] == bytes(seg - m.size - m.pslen)
            placed += raw[seg:]
        assert placed[: len(data)] == data and placed[len(data) :] == b""
        item = _req(_head([sent[0]])).optxrq_dp[0]
        assert item.xmdmi_length == len(data)
