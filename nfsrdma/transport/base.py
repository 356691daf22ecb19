"""The interface every transport offers the RPC layer.

A transport moves whole RPC messages over one connection, in both directions (NFSv4.1 sends
backchannel calls on the forward connection). Outbound, the RPC layer hands over a ``Writer``:
the encoded message whose DDP-eligible items (RFC 8267) are kept aside; a byte-stream transport
splices them back in, RPC-over-RDMA moves them by RDMA. Inbound, the transport hands over a
``Reader`` positioned at the XID, with any chunks that carry DDP-eligible items.

What a transport needs to know of a particular message (RDMA: the call's write list and reply
chunk, which its reply must use) travels in the opaque ``context`` of an ``Inbound`` and comes
back to the transport with the reply.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from nfsrdma.xdr.runtime import Reader, Writer

_conn_ids = itertools.count(1)


@dataclass(slots=True)
class Inbound:
    """One received RPC message."""

    reader: Reader  # the message from its XID on
    context: object = None  # transport-private; passed back with the reply


@dataclass(slots=True)
class ReplyExpectation:
    """What a requester prepares for a call's reply (used by RPC-over-RDMA, ignored by TCP).

    ``sinks`` are caller buffers that DDP-eligible results should land in, in order of the
    READ-class operations; ``max_size`` bounds the whole reply (for sizing a Reply chunk)."""

    sinks: list[memoryview] = field(default_factory=list)
    max_size: int = 0


class Connection(abc.ABC):
    """One transport connection. Messages in either direction; replies on the connection that
    carried the call (TR-22)."""

    kind: str = "?"  # "tcp" or "rdma"
    # Whether ``lend`` can give memory at all: set for each class, by whether it overrides it
    # (so that READ asks only transports that may lend: RPC-over-RDMA's).
    lends: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.lends = cls.lend is not Connection.lend

    def __init__(self, peer: str) -> None:
        self.id = next(_conn_ids)
        self.peer = peer
        self.receiver: Callable[[Connection, Inbound], None] | None = None
        # Fails one outstanding call (RPC-over-RDMA: an RDMA_ERROR answered it, UL-25).
        self.call_failed: Callable[[int, BaseException], None] | None = None
        self.closed_callbacks: list[Callable[[Connection, BaseException | None], None]] = []
        self.closed = False
        self.messages_received = 0  # whole messages delivered so far
        # Sees every message's bytes as sent (True) or received (False): TCP stream bytes, or
        # whole RPC-over-RDMA Sends. For tracing (``nfsrdma conform --trace``); None costs nothing.
        self.tap: Callable[[bool, bytes], None] | None = None

    def set_receiver(self, receiver: Callable[[Connection, Inbound], None]) -> None:
        self.receiver = receiver

    def on_closed(self, cb: Callable[[Connection, BaseException | None], None]) -> None:
        if self.closed:
            cb(self, None)
        else:
            self.closed_callbacks.append(cb)

    def _deliver(self, msg: Inbound) -> None:
        self.messages_received += 1
        if self.receiver is not None:
            self.receiver(self, msg)

    def _closed(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed = True
        callbacks, self.closed_callbacks = self.closed_callbacks, []
        for cb in callbacks:
            cb(self, exc)

    @abc.abstractmethod
    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        """Send a call. Raises ConnectionError when the connection cannot take it."""

    @abc.abstractmethod
    def send_reply(self, request: Inbound, msg: Writer) -> None:
        """Send the reply to ``request``, which arrived on this connection."""

    def call_done(self, xid: int) -> None:  # noqa: B027 - optional hook
        """The requester is finished with call ``xid`` (replied, failed or abandoned): release
        anything the transport holds for it (RDMA: invalidate its memory, TR-20)."""

    def lend(self, request: Inbound, size: int) -> memoryview | None:
        """Memory for ``size`` bytes of DDP-eligible reply data to ``request`` (READ data), when
        the transport can send it from there with no copy (RPC-over-RDMA: a registered buffer
        that the reply's RDMA Write goes out of). The transport takes it back with the reply.
        None: the caller uses its own memory (byte streams gain nothing)."""
        return None

    async def reserve(self, probe: bool = False) -> None:  # noqa: B027 - optional hook
        """Wait until the transport may send another call (RDMA credits, TR-14). A ``probe``
        (an idle-connection keepalive) may use the credit kept back for it (UL-26)."""

    @property
    def receiving(self) -> bool:
        """Part of a message has arrived and the rest has not (a byte stream's partial record)."""
        return False

    @property
    def max_inline_call(self) -> int:
        """How large a call may be before transport-level measures are needed."""
        return 1 << 30

    @abc.abstractmethod
    def close(self) -> None:
        """Start closing; ``on_closed`` callbacks run when it is done."""

    def abort(self, exc: BaseException | None = None) -> None:
        """Drop the connection now, without flushing what is queued (the peer may not be
        reading); the ``on_closed`` callbacks get ``exc``, the reason, when given. A transport
        whose ``close`` already drops at once need not override this."""
        self.close()


class TransportCallError(ConnectionError):
    """The transport refused a call (RPC-over-RDMA RDMA_ERROR). The RPC did not complete; the
    connection may still be up (UL-20, UL-25)."""
