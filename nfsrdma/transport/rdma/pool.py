"""Pre-registered buffer pools: the steady-state inline path never registers memory.

A pool registers one region once and carves it into fixed-size buffers. Taking and returning a
buffer touches only a free list; the ``PooledBuffer`` objects themselves are made up front.

- send pool: Send buffers (transport header + inline RPC message); local access only;
- receive pool: one buffer per posted Receive, each at least the advertised Receive Size
  (PD-6: ``PrivateData.for_buffers(send.buffer_size, receive.buffer_size)``);
- data pool: larger buffers for RDMA Read sinks and RDMA Write sources; with
  ``windows=True`` they may also be exposed to the peer through per-RPC memory windows.
"""

from __future__ import annotations

import ctypes

from nfsrdma.transport.rdma.provider import (
    Access,
    MemoryRegion,
    ProtectionDomain,
    ProviderError,
    Sge,
)


class PoolExhausted(ProviderError):
    """No free buffer in the pool."""


class PooledBuffer:
    """One buffer of a pool: ``view`` is its bytes inside the pool's registered region.

    A plain class (compared by identity), not a dataclass: compiled, a dataclass's
    ``__init__`` stays interpreted, and its field types are evaluated at import."""

    __slots__ = ("addr", "in_use", "index", "lkey", "memory", "offset", "pool", "view", "whole")

    def __init__(self, pool: BufferPool, index: int, offset: int, view: memoryview) -> None:
        self.pool = pool
        self.index = index
        self.offset = offset  # within the pool's region
        self.view = view
        self.in_use = False
        region = pool.region
        # Where the buffer is and its key, fixed for the pool's life (one region, registered
        # once): taken once here, not through the pool and region per work request.
        self.addr: int = region.addr + offset
        self.lkey: int = region.lkey
        # Where ``view``'s bytes are in this process (not the registered address, which a
        # provider may choose): the pool's once, not a ``ctypes`` look-up per use.
        self.memory = None if pool.memory is None else pool.memory + offset
        self.whole = Sge(self.addr, len(view), self.lkey)  # the element for all of it

    def __repr__(self) -> str:
        return f"PooledBuffer(pool={self.pool.name!r}, index={self.index}, in_use={self.in_use})"

    @property
    def size(self) -> int:
        return len(self.view)

    def sge(self, length: int | None = None, offset: int = 0) -> Sge:
        """The element for ``length`` bytes (default: the rest of the buffer) from ``offset``."""
        size = len(self.view)
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise ProviderError(f"{offset}+{length} outside a {size}-byte buffer")
        return Sge(self.addr + offset, length, self.lkey)

    def release(self) -> None:
        self.pool.put(self)


class BufferPool:
    """``count`` buffers of ``buffer_size`` bytes in one registered region."""

    def __init__(
        self,
        pd: ProtectionDomain,
        count: int,
        buffer_size: int,
        access: Access,
        *,
        name: str = "pool",
    ) -> None:
        if count < 1 or buffer_size < 1:
            raise ProviderError("a pool needs at least one buffer of at least one byte")
        self.name = name
        self.buffer_size = buffer_size
        self.region: MemoryRegion = pd.register(count * buffer_size, access)
        memory = self.region.buffer
        self.memory = memory_address(memory)
        self._buffers = [
            PooledBuffer(self, i, i * buffer_size, memory[i * buffer_size : (i + 1) * buffer_size])
            for i in range(count)
        ]
        self._free = list(reversed(range(count)))  # a stack: recently used buffers first

    @property
    def count(self) -> int:
        return len(self._buffers)

    @property
    def available(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        return len(self._buffers) - len(self._free)

    def try_get(self) -> PooledBuffer | None:
        if not self._free:
            return None
        buf = self._buffers[self._free.pop()]
        buf.in_use = True
        return buf

    def get(self) -> PooledBuffer:
        buf = self.try_get()
        if buf is None:
            raise PoolExhausted(f"{self.name}: all {len(self._buffers)} buffers in use")
        return buf

    def put(self, buf: PooledBuffer) -> None:
        if buf.pool is not self:
            raise ProviderError(f"buffer does not belong to {self.name}")
        if not buf.in_use:
            raise ProviderError(f"{self.name}: buffer {buf.index} returned twice")
        buf.in_use = False
        self._free.append(buf.index)

    def by_addr(self, addr: int) -> PooledBuffer:
        """The buffer that ``addr`` (e.g. from an ``Sge``) falls in."""
        offset = addr - self.region.addr
        if not 0 <= offset < len(self._buffers) * self.buffer_size:
            raise ProviderError(f"address {addr:#x} is not in {self.name}")
        return self._buffers[offset // self.buffer_size]

    def close(self) -> None:
        """Deregister the region (buffers stay readable, but no longer usable for verbs)."""
        self.region.deregister()


def memory_address(data: object) -> int | None:
    """Where a writable buffer's bytes are in memory (None for read-only or empty ones)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(data))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):
        return None


def send_pool(pd: ProtectionDomain, count: int, buffer_size: int) -> BufferPool:
    return BufferPool(pd, count, buffer_size, Access.LOCAL_WRITE, name="send")


def receive_pool(pd: ProtectionDomain, count: int, buffer_size: int) -> BufferPool:
    return BufferPool(pd, count, buffer_size, Access.LOCAL_WRITE, name="receive")


def data_pool(
    pd: ProtectionDomain, count: int, buffer_size: int, *, windows: bool = False
) -> BufferPool:
    access = Access.LOCAL_WRITE | (Access.MW_BIND if windows else Access(0))
    return BufferPool(pd, count, buffer_size, access, name="data")
