"""Pre-registered buffer pools: one registration, no allocation in steady state."""

from __future__ import annotations

import pytest

from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.transport.rdma.inproc_memory import InprocPD, InprocRegion
from nfsrdma.transport.rdma.pool import (
    BufferPool,
    PoolExhausted,
    data_pool,
    receive_pool,
    send_pool,
)
from nfsrdma.transport.rdma.privdata import PrivateData, check_receive_provisioning
from nfsrdma.transport.rdma.provider import Access, ProviderError
from tests.unit.rdma.helpers import connect_pair


class CountingPD(InprocPD):
    registrations = 0

    def register(self, length: int, access: Access) -> InprocRegion:
        CountingPD.registrations += 1
        return super().register(length, access)


def test_pool_carves_one_registered_region() -> None:
    pd = InprocFabric().device("10.0.0.1").pd
    pool = BufferPool(pd, 4, 1024, Access.LOCAL_WRITE, name="t")
    assert (pool.count, pool.available, pool.in_use, pool.buffer_size) == (4, 4, 0, 1024)
    bufs = [pool.get() for _ in range(4)]
    assert pool.try_get() is None
    with pytest.raises(PoolExhausted):
        pool.get()
    assert sorted(b.offset for b in bufs) == [0, 1024, 2048, 3072]
    assert {b.lkey for b in bufs} == {pool.region.lkey}
    b = bufs[1]
    b.view[0:3] = b"abc"
    assert bytes(pool.region.buffer[b.offset : b.offset + 3]) == b"abc"  # a view, no copy
    assert b.sge() == pool.region.sge(b.offset, 1024)
    assert b.sge(10, offset=5).addr == pool.region.addr + b.offset + 5
    with pytest.raises(ProviderError):
        b.sge(1000, offset=100)
    assert pool.by_addr(b.addr + 1023) is b
    with pytest.raises(ProviderError):
        pool.by_addr(pool.region.addr + 4096)
    b.release()
    with pytest.raises(ProviderError):
        b.release()
    assert pool.get() is b  # most recently returned first
    other = BufferPool(pd, 1, 8, Access.LOCAL_WRITE)
    with pytest.raises(ProviderError):
        other.put(bufs[0])
    pool.close()
    assert not pool.region.registered


def test_pool_factories_access() -> None:
    pd = InprocFabric().device("10.0.0.1").pd
    assert send_pool(pd, 2, 1024).region.access == Access.LOCAL_WRITE
    assert receive_pool(pd, 2, 1024).region.access == Access.LOCAL_WRITE
    assert data_pool(pd, 2, 65536).region.access == Access.LOCAL_WRITE
    assert data_pool(pd, 2, 65536, windows=True).region.access & Access.MW_BIND
    with pytest.raises(ProviderError):
        BufferPool(pd, 0, 1024, Access.LOCAL_WRITE)


async def test_steady_state_inline_path_never_registers() -> None:
    """Sends and receives cycle through pooled buffers: the only registrations are the pools'.
    The advertised Receive Size matches the receive buffers (PD-6)."""
    p = await connect_pair()
    CountingPD.registrations = 0
    for dev in (p.client_dev, p.server_dev):
        dev.pd.__class__ = CountingPD
    sends = send_pool(p.client_dev.pd, 4, 1024)
    receives = receive_pool(p.server_dev.pd, 4, 1024)
    advertised = PrivateData.for_buffers(sends.buffer_size, receives.buffer_size)
    check_receive_provisioning(advertised, receives.buffer_size)
    assert CountingPD.registrations == 2
    for _ in range(4):
        buf = receives.get()
        p.server.post_recv(1000 + buf.index, buf.sge())
    for i in range(40):
        out = sends.get()
        out.view[0:4] = i.to_bytes(4, "big")
        p.client.post_send(i, [out.sge(4)])
        done = await p.client_events.wait_completion(i)
        assert done.ok
        out.release()
        await p.server_events.wait(lambda ev: len(ev.completions) == i + 1)  # noqa: B023
        got = p.server_events.completions[-1]
        assert got.ok and got.byte_len == 4
        buf = receives.by_addr(receives.region.addr + (got.wr_id - 1000) * 1024)
        assert bytes(buf.view[0:4]) == i.to_bytes(4, "big")
        p.server.post_recv(got.wr_id, buf.sge())  # repost the same buffer
    assert CountingPD.registrations == 2
