"""Message continuation end to end on the in-process provider (RT-X3, RT-4, RT-5, RT-6, RT-8,
RT-18, RT-19): long calls and replies as several Sends with no explicit RDMA operation, plain
v1 as the fallback, credits per transmission, and injected grouping faults."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

from nfsrdma.transport.base import ReplyExpectation
from nfsrdma.transport.rdma.credits import CreditWindow
from nfsrdma.transport.rdma.endpoint import RdmaConnection, RdmaOptions
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import U32, Buffer
from tests.unit.rdma.helpers import Patchable
from tests.unit.rdma.test_rpc_rdma import P_BLOB, P_READLINK, PROG, VERS, Rig, rig

EXPLICIT = ("read_chunks", "write_chunks", "reply_chunks", "registrations")


def explicit_rdma(r: Rig) -> int:
    """Explicit RDMA work: chunks offered and memory registered by the client, RDMA Reads and
    Writes posted by the server."""
    assert r.client is not None
    server = r.server[0]
    return (
        sum(r.client.stats[k] for k in EXPLICIT)
        + server.stats["rdma_reads"]
        + (server.stats["rdma_writes"])
    )


async def granted(r: Rig) -> None:
    """One NULL call: until the first reply the grant is 1 credit, too few to continue (RT-8)."""
    assert r.rpc is not None and r.client is not None
    await r.rpc.call(PROG, VERS, 0)
    assert r.client.credits.granted > 1


async def blob_call(r: Rig, size: int) -> None:
    assert r.rpc is not None
    blob = bytes(i % 253 for i in range(size))
    res = await r.rpc.call(PROG, VERS, P_BLOB, lambda w: nfs4.enc_utf8str_cs(w, blob))
    assert bytes(res.reader.buf[res.offset :]) == hashlib.sha256(blob).digest()


async def long_reply(r: Rig, size: int, max_size: int = 32_768) -> None:
    assert r.rpc is not None
    res = await r.rpc.call(
        PROG,
        VERS,
        P_READLINK,
        lambda w: w.extend(U32.pack(size)),
        expect=ReplyExpectation([], max_size=max_size),
    )
    text, _ = nfs4.dec_utf8str_cs(res.reader, res.offset)
    assert text == b"L" * size


async def test_rtx3_a_16k_call_and_a_16k_reply_take_no_explicit_rdma() -> None:
    async with rig() as r:
        assert r.client is not None
        await granted(r)
        await blob_call(r, 16 * 1024)
        await long_reply(r, 16 * 1024, max_size=16 * 1024 + 512)
        assert explicit_rdma(r) == 0
        assert r.client.stats["rtr_calls"] == 2  # the second only reserved reply receives
        assert r.client.stats["rtr_sends"] == 5 + 1  # 16 KiB in 4 KiB Sends, then one
        assert r.server[0].stats["rtr_replies_sent"] == 1
        assert r.server[0].stats["rtr_sends"] == 5
        assert r.client.credits.in_flight == 0


@pytest.mark.parametrize(("server_on", "client_on"), [(True, False), (False, True)])
async def test_rt1_without_both_blocks_plain_v1_and_zero_extension_traffic(
    server_on: bool, client_on: bool
) -> None:
    async with rig(RdmaOptions(rtrext=server_on), RdmaOptions(rtrext=client_on)) as r:
        assert r.client is not None
        await granted(r)
        await blob_call(r, 16 * 1024)
        await long_reply(r, 16 * 1024)
        assert r.client.stats["read_chunks"] == 1 and r.client.stats["reply_chunks"] == 1
        for c in (r.client, r.server[0]):
            assert c.stats["rtr_sends"] == 0 and c.stats["rtr_receives"] == 0


async def test_rt4_rt5_limits_of_1_fall_back_to_v1() -> None:
    server = RdmaOptions(rtr_request_limit=1, rtr_response_limit=1)
    async with rig(server, RdmaOptions()) as r:
        assert r.client is not None
        await granted(r)
        await blob_call(r, 16 * 1024)
        await long_reply(r, 16 * 1024)
        assert r.client.stats["read_chunks"] == 1 and r.client.stats["reply_chunks"] == 1
        assert r.client.stats["rtr_sends"] == 0


async def test_rt4_a_call_beyond_the_limit_goes_by_position_zero_chunk() -> None:
    async with rig(RdmaOptions(rtr_request_limit=3), RdmaOptions()) as r:
        assert r.client is not None
        await granted(r)
        await blob_call(r, 10_000)  # 3 transmissions: continued
        assert r.client.stats["rtr_calls"] == 1 and r.client.stats["read_chunks"] == 0
        await blob_call(r, 16 * 1024)  # 5 transmissions: over the limit
        assert r.client.stats["read_chunks"] == 1


async def test_rt5_rt8_a_reply_larger_than_the_reserve_uses_the_reply_chunk() -> None:
    async with rig(RdmaOptions(rtr_response_limit=2), RdmaOptions()) as r:
        assert r.client is not None
        await granted(r)
        await long_reply(r, 20_000)  # needs 5 transmissions, only 2 may be reserved
        assert r.client.stats["reply_chunks"] == 1
        assert r.server[0].stats["rtr_replies_sent"] == 0
        await long_reply(r, 6_000, max_size=6_100)  # 2 transmissions: continued
        assert r.server[0].stats["rtr_replies_sent"] == 1
        assert r.client.stats["reply_chunks"] == 1


async def test_rt8_credits_per_transmission_over_random_sizes() -> None:
    """Random call and reply sizes, many at once: the requester never holds more credits
    than granted, the responder never sees an overrun, every reserved receive comes back."""
    rnd = random.Random(8)
    async with rig(RdmaOptions(credits=12), RdmaOptions(max_requests=12)) as r:
        client = r.client
        assert client is not None
        peaks: list[int] = []

        class Watched(CreditWindow):
            __slots__ = ()

            def sent(self, n: int = 1) -> None:
                super().sent(n)
                assert self.in_flight <= self.granted  # never beyond the grant
                peaks.append(self.in_flight)

        client.credits = Watched(client.credits.local_max)
        await granted(r)

        async def one() -> None:
            assert r.rpc is not None
            if rnd.random() < 0.5:
                await blob_call(r, rnd.randrange(0, 30_000))
            else:
                n = rnd.randrange(0, 30_000)
                await long_reply(r, n, max_size=n + rnd.randrange(0, 3000) + 64)

        for _ in range(4):
            await asyncio.gather(*(one() for _ in range(16)))
        assert client.credits.in_flight == 0
        assert r.server[0].stats["credit_overruns"] == 0
        assert client.stats["rtr_calls"] > 0 and r.server[0].stats["rtr_replies_sent"] > 0
        assert max(peaks) > 1


def _corrupt_groups(conn: RdmaConnection, how: str) -> None:
    """Fault injection: the client's next continued call goes out broken."""
    original = conn._send_group

    def broken(transmissions: list[list[Buffer]]) -> None:
        group = list(transmissions)
        if how == "reorder":
            group[1], group[2] = group[2], group[1]
        elif how == "drop":
            del group[1]
        conn._send_group = original  # type: ignore[method-assign]
        original(group)

    conn._send_group = broken  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["reorder", "drop"])
async def test_rt18_rt19_a_broken_call_group_is_reported_and_resent_over_v1(how: str) -> None:
    async with rig(connection=Patchable) as r:
        assert r.client is not None and r.rpc is not None
        await granted(r)
        _corrupt_groups(r.client, how)
        await blob_call(r, 16 * 1024)  # completes: resent as plain v1 after the REPTERR
        assert r.server[0].stats["rtr_faults"] == 1
        assert r.client.stats["rtr_repterr"] == 1 and r.client.stats["rtr_fallbacks"] == 1
        await blob_call(r, 16 * 1024)  # the connection serves on
        await r.rpc.call(PROG, VERS, 0)


async def test_rt8_unused_reserved_receives_are_recycled_at_the_first_reply_transmission() -> None:
    releases: list[int] = []

    class Watched(CreditWindow):
        __slots__ = ()

        def done(self, n: int = 1) -> None:
            releases.append(n)
            super().done(n)

    async with rig() as r:
        assert r.client is not None
        r.client.credits = Watched(r.client.credits.local_max)
        await granted(r)
        releases.clear()
        await long_reply(r, 5000, max_size=20_000)  # 5 transmissions reserved, 2 used
        assert r.server[0].stats["rtr_replies_sent"] == 1
        assert releases == [3, 2]  # the 3 unused at the reply's first transmission, then 2
        assert r.client.credits.in_flight == 0


async def test_rt6_rt18_a_plain_message_inside_a_call_group_breaks_that_call_only() -> None:
    """The client slips a plain v1 call in the middle of its own continued call: the server
    reports BADHMT naming the continued call (the group's lead), which the client resends over
    plain v1; the plain call completes too."""
    async with rig(connection=Patchable) as r:
        client = r.client
        assert client is not None and r.rpc is not None
        await granted(r)
        original = client._send_group
        stash: list[list[Buffer]] = []
        built = asyncio.Event()

        def hold(transmissions: list[list[Buffer]]) -> None:
            stash.extend(transmissions)  # sent later, split by a plain call
            built.set()

        client._send_group = hold  # type: ignore[method-assign]
        broken = asyncio.ensure_future(blob_call(r, 16 * 1024))
        await asyncio.wait_for(built.wait(), 5)
        client._send_group = original  # type: ignore[method-assign]
        original(stash[:2])
        plain = asyncio.ensure_future(r.rpc.call(PROG, VERS, 0))
        await asyncio.wait_for(broken, 5)
        await asyncio.wait_for(plain, 5)
        assert r.server[0].stats["rtr_faults"] == 1
        assert client.stats["rtr_fallbacks"] == 1
