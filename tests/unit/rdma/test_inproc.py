"""The in-process provider: RC semantics, and failing the way hardware fails."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from nfsrdma.transport.rdma import privdata
from nfsrdma.transport.rdma.inproc import InprocConnection, InprocFabric
from nfsrdma.transport.rdma.privdata import PrivateData
from nfsrdma.transport.rdma.provider import (
    Access,
    ConnectionRejected,
    DeviceCaps,
    ProviderError,
    QueuePairConfig,
    WcOpcode,
    WcStatus,
)
from tests.unit.conditions import loop_turn
from tests.unit.rdma.helpers import ALL, CONFIG, PORT, Events, connect_pair


def recvs(
    count: int, size: int = 4096
) -> tuple[list[memoryview], Callable[[InprocConnection], None]]:
    """A ``client_recvs``/``server_recvs`` hook posting ``count`` receives (wr_id 100+i)."""
    views: list[memoryview] = []

    def post(conn: InprocConnection) -> None:
        region = conn._device.pd.register(count * size, Access.LOCAL_WRITE)
        for i in range(count):
            conn.post_recv(100 + i, region.sge(i * size, size))
            views.append(region.buffer[i * size : (i + 1) * size])

    return views, post


async def test_connect_carries_private_data_both_ways_padded() -> None:
    """PD-1, PD-13: the connect request's and the accept's private data arrive zero-padded
    to the IB CM sizes (56 and 196 octets) and decode."""
    mine = privdata.encode(PrivateData(4096, 4096, True))
    theirs = privdata.encode(PrivateData(8192, 4096, False))
    p = await connect_pair(client_pd=mine, server_pd=theirs)
    assert p.server_pd_received == mine + bytes(48)
    assert p.client_pd_received == theirs + bytes(188)
    assert privdata.decode(p.server_pd_received) == PrivateData(4096, 4096, True)
    assert privdata.decode(p.client_pd_received) == PrivateData(8192, 4096, False)
    assert p.client.established and p.server.established


async def test_read_resources_negotiated_tr26() -> None:
    """TR-26: the client offers IRD 4 / ORD 0, the server accepts with ORD 4 / IRD 0."""
    p = await connect_pair(client_rr=4, client_id=0, server_rr=0, server_id=4)
    assert (p.client.responder_resources, p.client.initiator_depth) == (4, 0)
    assert (p.server.responder_resources, p.server.initiator_depth) == (0, 4)


async def test_accept_with_ord_above_peer_ird_is_refused_tr26() -> None:
    fabric = InprocFabric()
    server_dev, client_dev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    listener = await server_dev.listen(PORT)
    client = await client_dev.resolve("10.0.0.1", PORT, CONFIG, Events())
    connecting = asyncio.ensure_future(client.establish(responder_resources=2))
    request = await listener.get_request()
    assert request.initiator_depth == 2
    conn = request.create_connection(CONFIG, Events())
    with pytest.raises(ProviderError):
        await conn.establish(initiator_depth=3)
    request.reject()
    with pytest.raises(ConnectionRejected):
        await connecting


async def test_send_gathers_and_completes_asynchronously() -> None:
    views, post = recvs(2)
    p = await connect_pair(server_recvs=post)
    region = p.client_dev.pd.register(8192, Access.LOCAL_WRITE)
    region.buffer[0:5] = b"hello"
    region.buffer[4000:4006] = b"world!"
    p.client_events.inside_post = True
    p.client.post_send(1, [region.sge(0, 5), region.sge(4000, 6)])
    p.client_events.inside_post = False
    assert p.client_events.items == []  # nothing delivered from inside post_send
    send = await p.client_events.wait_completion(1)
    recv = await p.server_events.wait_completion(100)
    assert (send.status, send.opcode) == (WcStatus.SUCCESS, WcOpcode.SEND)
    assert (recv.status, recv.opcode, recv.byte_len) == (WcStatus.SUCCESS, WcOpcode.RECV, 11)
    assert recv.invalidated_rkey is None
    assert bytes(views[0][:11]) == b"helloworld!"
    assert not p.client_events.reentrant


async def test_inline_send_copies_at_post_time() -> None:
    views, post = recvs(1)
    p = await connect_pair(server_recvs=post)
    region = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    region.buffer[0:6] = b"inline"
    p.client.post_send(1, [region.sge(0, 6)], inline=True)
    region.buffer[0:6] = b"change"
    await p.server_events.wait_completion(100)
    assert bytes(views[0][:6]) == b"inline"
    with pytest.raises(ProviderError):  # above max_inline_data
        p.client.post_send(3, [p.client_dev.pd.register(65, ALL).sge()], inline=True)


async def test_rdma_write_and_read_with_the_peers_rkey() -> None:
    p = await connect_pair()
    exposed = p.client_dev.pd.register(65536, ALL)
    local = p.server_dev.pd.register(8192, Access.LOCAL_WRITE)
    local.buffer[0:7] = b"written"
    p.server.post_rdma_write(1, [local.sge(0, 7)], exposed.addr + 30000, exposed.rkey)
    assert (await p.server_events.wait_completion(1)).ok
    assert bytes(exposed.buffer[30000:30007]) == b"written"
    exposed.buffer[100:104] = b"READ"
    p.server.post_rdma_read(
        2, [local.sge(4096, 2), local.sge(6000, 2)], exposed.addr + 100, exposed.rkey
    )
    read = await p.server_events.wait_completion(2)
    assert (read.ok, read.opcode, read.byte_len) == (True, WcOpcode.RDMA_READ, 4)
    assert bytes(local.buffer[4096:4098]) + bytes(local.buffer[6000:6002]) == b"READ"
    assert p.client_events.items == []  # one-sided: nothing at the target


async def test_rdma_into_registered_caller_memory_is_zero_copy() -> None:
    p = await connect_pair()
    target = bytearray(4096)
    exposed = p.client_dev.pd.register_buffer(memoryview(target), ALL)
    local = p.server_dev.pd.register(16, Access.LOCAL_WRITE)
    local.buffer[:] = b"0123456789abcdef"
    p.server.post_rdma_write(1, [local.sge()], exposed.addr + 10, exposed.rkey)
    await p.server_events.wait_completion(1)
    assert target[10:26] == b"0123456789abcdef"
    with pytest.raises(BufferError):
        target.extend(b"x")  # registration pins the bytearray


@pytest.mark.parametrize(
    ("op", "rkey_delta", "offset", "access", "why"),
    [
        ("write", 0x100, 0, ALL, "unknown rkey"),
        ("write", 0, 4090, ALL, "out of bounds"),
        ("read", 0, -8, ALL, "below the region"),
        ("write", 0, 0, Access.LOCAL_WRITE | Access.REMOTE_READ, "no REMOTE_WRITE"),
        ("read", 0, 0, Access.LOCAL_WRITE | Access.REMOTE_WRITE, "no REMOTE_READ"),
    ],
)
async def test_remote_access_error_breaks_the_connection(
    op: str, rkey_delta: int, offset: int, access: Access, why: str
) -> None:
    """A bad rkey, bounds or right: REM_ACCESS_ERR at the requester, both queue pairs flush,
    both sides get Disconnected, and later posts complete with WR_FLUSH_ERR."""
    del why
    _, client_posts = recvs(2)
    _, server_posts = recvs(2)
    p = await connect_pair(client_recvs=client_posts, server_recvs=server_posts)
    exposed = p.client_dev.pd.register(4096, access)
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    post = p.server.post_rdma_write if op == "write" else p.server.post_rdma_read
    post(1, [local.sge(0, 16)], exposed.addr + offset, exposed.rkey + rkey_delta)
    failed = await p.server_events.wait_completion(1)
    assert failed.status is WcStatus.REM_ACCESS_ERR
    assert (await p.server_events.wait_disconnect()).status is WcStatus.REM_ACCESS_ERR
    await p.client_events.wait_disconnect()
    for events in (p.server_events, p.client_events):
        assert [c.status for c in events.completions if c.opcode is WcOpcode.RECV] == [
            WcStatus.WR_FLUSH_ERR
        ] * 2
    assert p.server.broken and p.client.broken
    p.server.post_send(9, [local.sge(0, 4)])
    assert (await p.server_events.wait_completion(9)).status is WcStatus.WR_FLUSH_ERR


async def test_deregistered_region_rkey_is_unusable_tr24() -> None:
    """TR-24: after deregistration (the per-RPC invalidation path) the rkey is rejected."""
    p = await connect_pair()
    exposed = p.client_dev.pd.register(4096, ALL)
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    exposed.deregister()
    exposed.deregister()  # idempotent
    assert not exposed.registered
    p.server.post_rdma_read(1, [local.sge(0, 8)], exposed.addr, exposed.rkey)
    assert (await p.server_events.wait_completion(1)).status is WcStatus.REM_ACCESS_ERR


async def test_rkeys_do_not_carry_over_to_a_new_connection_tr24() -> None:
    """TR-24: a window bound on one connection is not usable through another."""
    fabric = InprocFabric()
    p = await connect_pair(fabric=fabric)
    region = p.client_dev.pd.register(4096, ALL | Access.MW_BIND)
    window = p.client_dev.pd.alloc_window()
    rkey = p.client.post_bind_window(1, window, region, 0, 4096, Access.REMOTE_WRITE)
    await p.client_events.wait_completion(1)
    listener2 = await p.server_dev.listen(PORT + 1)
    ev_c, ev_s = Events(), Events()
    c2 = await p.client_dev.resolve("10.0.0.1", PORT + 1, CONFIG, ev_c)

    async def accept() -> InprocConnection:
        conn = (await listener2.get_request()).create_connection(CONFIG, ev_s)
        await conn.establish(initiator_depth=1)
        return conn

    task = asyncio.ensure_future(accept())
    await c2.establish(responder_resources=1)
    s2 = await task
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    s2.post_rdma_write(1, [local.sge(0, 8)], region.addr, rkey)
    assert (await ev_s.wait_completion(1)).status is WcStatus.REM_ACCESS_ERR
    p.server.post_rdma_write(2, [local.sge(0, 8)], region.addr, rkey)
    assert (await p.server_events.wait_completion(2)).ok


async def test_local_protection_error_on_bad_lkey() -> None:
    p = await connect_pair()
    exposed = p.client_dev.pd.register(4096, ALL)
    p.server.post_rdma_write(1, [exposed.sge(0, 8)], exposed.addr, exposed.rkey)  # client lkey
    assert (await p.server_events.wait_completion(1)).status is WcStatus.LOC_PROT_ERR
    await p.server_events.wait_disconnect()
    await p.client_events.wait_disconnect()


async def test_rnr_retry_zero_fails_the_sender_only_with_rnr_retry_exc() -> None:
    p = await connect_pair(rnr_retry=0)
    region = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    p.client.post_send(1, [region.sge(0, 8)])
    assert (await p.client_events.wait_completion(1)).status is WcStatus.RNR_RETRY_EXC_ERR
    assert (await p.client_events.wait_disconnect()).status is WcStatus.RNR_RETRY_EXC_ERR
    assert (await p.server_events.wait_disconnect()).status is None  # by the CM disconnect
    assert p.server_events.completions == []


async def test_rnr_retry_finite_succeeds_if_a_receive_arrives_in_time() -> None:
    """A Send that found no receive (RNR) goes through when one is posted within its retry
    budget, and the Send queued behind it follows in order. The RNR timer is far longer than
    the test may take, so only the receive's arrival can complete the Sends."""
    p = await connect_pair(rnr_retry=3, fabric=InprocFabric(rnr_timer=60.0))
    region = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    rbuf = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    p.client.post_send(1, [region.sge(0, 8)])
    p.client.post_send(2, [region.sge(8, 8)])  # waits behind the first, in order
    await loop_turn()  # the first Send has been tried and met an empty receive queue
    assert p.client_events.items == [] and p.server_events.items == []
    p.server.post_recv(7, rbuf.sge(0, 32))
    p.server.post_recv(8, rbuf.sge(32, 32))
    assert (await p.client_events.wait_completion(1)).ok
    assert (await p.client_events.wait_completion(2)).ok
    assert [c.wr_id for c in p.server_events.completions] == [7, 8]


async def test_rnr_retry_forever_waits_for_a_receive() -> None:
    """rnr_retry 7 waits for a receive however long it takes: it outlives the longest finite
    budget (6 retries), shown by a finite sender on the same RNR timer failing meanwhile."""
    timer = 0.001
    p = await connect_pair(rnr_retry=7, fabric=InprocFabric(rnr_timer=timer))
    finite = await connect_pair(rnr_retry=6, fabric=InprocFabric(rnr_timer=timer))
    region = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    p.client.post_send(1, [region.sge(0, 8)])
    control = finite.client_dev.pd.register(64, Access.LOCAL_WRITE)
    finite.client.post_send(1, [control.sge(0, 8)])
    failed = await finite.client_events.wait_completion(1)
    assert failed.status is WcStatus.RNR_RETRY_EXC_ERR  # the finite budget has run out ...
    assert p.client_events.items == []  # ... and the patient Send is still waiting
    p.server.post_recv(5, p.server_dev.pd.register(64, Access.LOCAL_WRITE).sge())
    assert (await p.client_events.wait_completion(1)).ok


async def test_send_longer_than_the_posted_receive_pd8() -> None:
    """PD-8: a Send above what the peer's receive holds: LOC_LEN_ERR at the receiver,
    REM_INV_REQ_ERR at the sender, and the connection is gone."""
    _, post = recvs(1, size=1024)
    p = await connect_pair(server_recvs=post)
    region = p.client_dev.pd.register(2048, Access.LOCAL_WRITE)
    p.client.post_send(1, [region.sge(0, 1025)])
    assert (await p.client_events.wait_completion(1)).status is WcStatus.REM_INV_REQ_ERR
    assert (await p.server_events.wait_completion(100)).status is WcStatus.LOC_LEN_ERR
    assert (await p.server_events.wait_disconnect()).status is WcStatus.LOC_LEN_ERR
    await p.client_events.wait_disconnect()


async def test_exactly_the_receive_size_succeeds_pd6() -> None:
    """PD-6: a peer sending exactly the advertised Receive Size succeeds."""
    _, post = recvs(1, size=4096)
    p = await connect_pair(server_recvs=post)
    region = p.client_dev.pd.register(4096, Access.LOCAL_WRITE)
    p.client.post_send(1, [region.sge()])
    assert (await p.server_events.wait_completion(100)).byte_len == 4096


async def test_send_with_invalidate_window_pd17() -> None:
    """PD-17 (b): the receive completion names the invalidated rkey; the window is then dead,
    and invalidating it again locally fails (no invalidate-twice)."""
    _, client_posts = recvs(2)
    p = await connect_pair(client_recvs=client_posts)
    region = p.client_dev.pd.register(8192, ALL | Access.MW_BIND)
    window = p.client_dev.pd.alloc_window()
    rkey = p.client.post_bind_window(1, window, region, 4096, 1000, Access.REMOTE_WRITE)
    assert rkey == window.rkey and rkey != region.rkey
    await p.client_events.wait_completion(1)
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    local.buffer[0:4] = b"data"
    p.server.post_rdma_write(2, [local.sge(0, 4)], region.addr + 4096, rkey)
    assert (await p.server_events.wait_completion(2)).ok
    assert bytes(region.buffer[4096:4100]) == b"data"
    with pytest.raises(ProviderError):
        p.client.post_bind_window(3, window, region, 0, 10, Access.REMOTE_WRITE)  # bound once
    p.server.post_send(4, [local.sge(0, 4)], invalidate_rkey=rkey)
    recv = await p.client_events.wait_completion(100)
    assert recv.ok and recv.invalidated_rkey == rkey
    p.client.post_local_invalidate(5, rkey)
    assert (await p.client_events.wait_completion(5)).status is WcStatus.MW_BIND_ERR
    await p.client_events.wait_disconnect()


async def test_invalidated_window_rejects_remote_access() -> None:
    p = await connect_pair()
    region = p.client_dev.pd.register(8192, ALL | Access.MW_BIND)
    window = p.client_dev.pd.alloc_window()
    rkey = p.client.post_bind_window(1, window, region, 0, 8192, Access.REMOTE_READ)
    p.client.post_local_invalidate(2, rkey)
    assert (await p.client_events.wait_completion(2)).ok
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    p.server.post_rdma_read(3, [local.sge(0, 8)], region.addr, rkey)
    assert (await p.server_events.wait_completion(3)).status is WcStatus.REM_ACCESS_ERR


async def test_window_rights_and_bounds_are_enforced() -> None:
    p = await connect_pair()
    region = p.client_dev.pd.register(8192, ALL | Access.MW_BIND)
    window = p.client_dev.pd.alloc_window()
    rkey = p.client.post_bind_window(1, window, region, 100, 100, Access.REMOTE_READ)
    local = p.server_dev.pd.register(512, Access.LOCAL_WRITE)
    p.server.post_rdma_read(2, [local.sge(0, 100)], region.addr + 100, rkey)
    assert (await p.server_events.wait_completion(2)).ok
    p.server.post_rdma_write(3, [local.sge(0, 8)], region.addr + 100, rkey)
    assert (await p.server_events.wait_completion(3)).status is WcStatus.REM_ACCESS_ERR


async def test_bind_needs_mw_bind_access() -> None:
    p = await connect_pair()
    region = p.client_dev.pd.register(4096, ALL)
    window = p.client_dev.pd.alloc_window()
    p.client.post_bind_window(1, window, region, 0, 4096, Access.REMOTE_READ)
    assert (await p.client_events.wait_completion(1)).status is WcStatus.MW_BIND_ERR


async def test_send_with_invalidate_of_a_plain_region_fails() -> None:
    """A Send with Invalidate naming an rkey the receiver cannot invalidate (a plain region,
    as ``ibv_reg_mr`` gives) fails the receive and breaks the connection (rxe does too)."""
    _, client_posts = recvs(1)
    p = await connect_pair(client_recvs=client_posts)
    region = p.client_dev.pd.register(4096, ALL)
    local = p.server_dev.pd.register(64, Access.LOCAL_WRITE)
    p.server.post_send(1, [local.sge(0, 4)], invalidate_rkey=region.rkey)
    assert (await p.client_events.wait_completion(100)).status is WcStatus.REM_INV_REQ_ERR
    await p.client_events.wait_disconnect()
    await p.server_events.wait_disconnect()


async def test_send_with_invalidate_needs_device_support_pd16() -> None:
    caps = DeviceCaps("noinv", 4, 4, 0, 64, 4, 4, remote_invalidate=False, memory_windows=False)
    fabric = InprocFabric()
    dev = fabric.device("10.0.0.9", caps)
    assert not privdata.responder_advertises_r(dev.caps.remote_invalidate)
    with pytest.raises(ProviderError):
        dev.pd.alloc_window()


async def test_rdma_read_needs_a_non_zero_ord_tr26() -> None:
    """TR-26: a side that negotiated ORD 0 (as our client does) cannot issue RDMA Reads; the
    client's ORD is bounded by the server's IRD."""
    p = await connect_pair(client_rr=4, client_id=4, server_rr=0, server_id=4)
    assert p.client.initiator_depth == 0
    exposed = p.server_dev.pd.register(64, ALL)
    local = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    p.client.post_rdma_read(1, [local.sge(0, 8)], exposed.addr, exposed.rkey)
    assert (await p.client_events.wait_completion(1)).status is WcStatus.LOC_QP_OP_ERR


async def test_reject_carries_private_data_and_missing_listener_rejects() -> None:
    fabric = InprocFabric()
    server_dev, client_dev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    client = await client_dev.resolve("10.0.0.1", PORT, CONFIG, Events())
    with pytest.raises(ConnectionRejected) as nobody:
        await client.establish(b"hello")
    assert nobody.value.status == 8  # IB CM: invalid service ID
    listener = await server_dev.listen(PORT)
    connecting = asyncio.ensure_future(client.establish(b"hello"))
    request = await listener.get_request()
    assert request.private_data.startswith(b"hello")
    request.reject(b"go away")
    with pytest.raises(ConnectionRejected) as rejected:
        await connecting
    assert rejected.value.private_data.startswith(b"go away")
    assert rejected.value.status == 28


async def test_unknown_address_fails_resolution() -> None:
    fabric = InprocFabric()
    dev = fabric.device("10.0.0.2")
    with pytest.raises(ProviderError):
        await dev.resolve("10.9.9.9", PORT, CONFIG, Events())


async def test_disconnect_flushes_and_reports_both_sides_once() -> None:
    _, client_posts = recvs(3)
    _, server_posts = recvs(2)
    p = await connect_pair(client_recvs=client_posts, server_recvs=server_posts)
    p.client.disconnect()
    p.client.disconnect()
    assert (await p.client_events.wait_disconnect()).reason == "local disconnect"
    assert (await p.server_events.wait_disconnect()).reason == "peer disconnected"
    await loop_turn()  # a second report, had one been queued, would have arrived by now
    assert len(p.client_events.disconnects) == 1 and len(p.server_events.disconnects) == 1
    assert [c.status for c in p.client_events.completions] == [WcStatus.WR_FLUSH_ERR] * 3
    assert [c.status for c in p.server_events.completions] == [WcStatus.WR_FLUSH_ERR] * 2
    p.client.close()
    with pytest.raises(ProviderError):
        p.client.post_recv(1, p.client_dev.pd.register(8, Access.LOCAL_WRITE).sge())


async def test_close_delivers_nothing_more_and_disconnects_the_peer() -> None:
    p = await connect_pair()
    p.server.close()
    p.server.close()
    await p.client_events.wait_disconnect()
    await loop_turn()  # anything queued for the closed side would have arrived by now
    assert p.server_events.items == []


async def test_posting_rules() -> None:
    """Sends need a connected queue pair; receives may be posted before (PD-24); wr_ids must
    be unique among outstanding requests; queue depth and SGE limits are enforced."""
    fabric = InprocFabric()
    server_dev, client_dev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    small = QueuePairConfig(max_send_wr=2, max_recv_wr=2, max_send_sge=1)
    client = await client_dev.resolve("10.0.0.1", PORT, small, Events())
    region = client_dev.pd.register(4096, Access.LOCAL_WRITE)
    with pytest.raises(ProviderError):
        client.post_send(1, [region.sge(0, 8)])
    client.post_recv(1, region.sge(0, 1024))
    with pytest.raises(ProviderError):
        client.post_recv(1, region.sge(1024, 1024))
    client.post_recv(2, region.sge(1024, 1024))
    with pytest.raises(ProviderError):
        client.post_recv(3, region.sge(2048, 1024))
    listener = await server_dev.listen(PORT)
    events = Events()

    async def accept() -> InprocConnection:
        conn = (await listener.get_request()).create_connection(small, events)
        await conn.establish()
        return conn

    task = asyncio.ensure_future(accept())
    await client.establish()
    await task
    with pytest.raises(ProviderError):
        client.post_send(10, [region.sge(0, 8), region.sge(8, 8)])
    with pytest.raises(ProviderError):
        await client_dev.resolve("10.0.0.1", PORT, QueuePairConfig(max_send_sge=64), Events())
    with pytest.raises(ProviderError):
        client_dev.pd.register(64, Access.REMOTE_WRITE)  # needs LOCAL_WRITE, as ibv_reg_mr


async def test_first_message_right_after_establishment_pd24() -> None:
    """PD-24: receives posted before accepting; the client sends at once after its
    ``establish`` returns, with RNR retries disabled: no RNR, and the data arrives."""
    views, post = recvs(4)
    p = await connect_pair(server_recvs=post, rnr_retry=0)
    region = p.client_dev.pd.register(64, Access.LOCAL_WRITE)
    region.buffer[0:4] = b"call"
    p.client.post_send(1, [region.sge(0, 4)])
    assert (await p.client_events.wait_completion(1)).ok
    assert bytes(views[0][:4]) == b"call"


async def test_private_data_is_per_connection_pd14() -> None:
    """PD-14: the server changes its advertised sizes between two connections; the thresholds
    the client derives follow each connection's accept."""
    fabric = InprocFabric()
    server_dev, client_dev = fabric.device("10.0.0.1"), fabric.device("10.0.0.2")
    listener = await server_dev.listen(PORT)
    mine = PrivateData.for_buffers(65536, 65536, remote_invalidate=True)
    results = []
    for server_recv in (4096, 16384):
        client = await client_dev.resolve("10.0.0.1", PORT, CONFIG, Events())

        async def accept(size: int = server_recv) -> None:
            request = await listener.get_request()
            peer = privdata.decode(request.private_data)
            conn = request.create_connection(CONFIG, Events())
            await conn.establish(privdata.encode(PrivateData(size, size)), initiator_depth=1)
            assert peer == mine

        task = asyncio.ensure_future(accept())
        accepted = await client.establish(privdata.encode(mine), responder_resources=1)
        await task
        results.append(privdata.inline_thresholds(mine, privdata.decode(accepted)))
        client.close()
    assert results == [
        privdata.InlineThresholds(4096, 4096),
        privdata.InlineThresholds(16384, 16384),
    ]


async def test_listener_rules() -> None:
    fabric = InprocFabric()
    dev = fabric.device("10.0.0.1")
    listener = await dev.listen(PORT)
    with pytest.raises(ProviderError):
        await dev.listen(PORT)
    other = await dev.listen(0)
    assert other.port != PORT
    listener.close()
    await dev.listen(PORT)  # free again
    dev.close()
    with pytest.raises(ProviderError):
        await dev.listen(PORT + 5)
