"""What an RPC-over-RDMA connection holds per call: a requester's outstanding call (its
registrations and sinks), a responder's call being assembled or answered, and the local
scratch memory chunk data passes through."""

from __future__ import annotations

from nfsrdma.transport.base import ReplyExpectation
from nfsrdma.transport.rdma.header import Header
from nfsrdma.transport.rdma.pool import PooledBuffer, memory_address
from nfsrdma.transport.rdma.provider import MemoryRegion, Sge
from nfsrdma.xdr.runtime import Buffer, Writer

__all__ = ["CallContext", "InCall", "OutCall", "Scratch"]


class OutCall:
    """What a requester holds for one outstanding call. (The classes here are plain classes,
    not dataclasses: compiled, a dataclass's ``__init__`` stays interpreted, and one of these
    is made for every call.)"""

    __slots__ = (
        "counted",
        "held",
        "plain_retry",
        "regions",
        "reply_region",
        "reply_transmissions",
        "sinks",
        "xid",
    )

    def __init__(self, xid: int, *, counted: bool = True) -> None:
        self.xid = xid
        self.regions: list[MemoryRegion] = []
        self.sinks: list[tuple[MemoryRegion, memoryview, bool]] = []
        self.reply_region: MemoryRegion | None = None
        self.counted = counted  # holds credits
        self.held = 1  # credits held: transmissions of the call or of its reply (RT-8)
        self.reply_transmissions = 1  # what a continued reply may use (rtrext)
        # A continued call keeps its message and expectation until its reply, to resend it
        # with plain v1 if the responder reports the group broken (REPTERR, RT-19).
        self.plain_retry: tuple[Writer, ReplyExpectation | None] | None = None


class Scratch:
    """Local memory a responder reads chunk data into or writes it from: a buffer of the
    connection's pre-registered data pool, or (when none is free or it is too small) a region
    registered for this one use. Never exposed to the peer (local access only)."""

    __slots__ = ("buf", "region")

    def __init__(self, buf: PooledBuffer | None, region: MemoryRegion | None) -> None:
        self.buf = buf
        self.region = region

    @property
    def view(self) -> memoryview:
        if self.buf is not None:
            return self.buf.view
        assert self.region is not None
        return self.region.buffer

    @property
    def memory(self) -> int | None:
        """Where ``view``'s bytes are in this process (None if unknown)."""
        if self.buf is not None:
            return self.buf.memory
        assert self.region is not None
        return memory_address(self.region.buffer)

    def sge(self, offset: int, length: int) -> Sge:
        if self.buf is not None:
            return self.buf.sge(length, offset)
        assert self.region is not None
        return self.region.sge(offset, length)

    def release(self) -> None:
        if self.buf is not None:
            self.buf.release()
            self.buf = None
        elif self.region is not None:
            self.region.deregister()
            self.region = None


class InCall:
    """A call being assembled (RDMA Reads of its chunks) or being answered."""

    __slots__ = ("chunks", "header", "message", "pending_reads", "scratch")

    def __init__(self, header: Header, message: Buffer) -> None:
        self.header = header
        self.message = message
        self.chunks: dict[int, Buffer] = {}
        self.pending_reads = 0
        self.scratch: list[Scratch] = []


class CallContext:
    """Transport state of an inbound call, handed back with its reply."""

    __slots__ = ("header", "lent", "scratch")

    def __init__(self, header: Header, scratch: list[Scratch]) -> None:
        self.header = header
        self.scratch = scratch
        # Registered memory lent for the reply's READ data (``Responder.lend``), taken back
        # with it.
        self.lent: list[Scratch] = []
