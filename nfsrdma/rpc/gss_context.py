"""RPCSEC_GSS context state, sans-IO: the sequence window and the table of contexts.

RFC 2203 section 5.3.3.1: the server keeps, per context, a window of sequence numbers; a
request whose number is below the window, or already seen within it, is discarded without a
reply; a number above the window advances it. Time is passed in (``now``), never read."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from nfsrdma.rpc.auth import Credential
from nfsrdma.rpc.gss_mech import GssSecurityContext

DEFAULT_WINDOW = 128  # as knfsd offers
DEFAULT_MAX_CONTEXTS = 4096


class SequenceWindow:
    """The sequence numbers seen: the highest, and a bit per number in the window below it."""

    __slots__ = ("bits", "highest", "size")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        self.size = size
        self.highest = -1  # nothing seen yet
        self.bits = 0  # bit i: highest - i was seen

    def fresh(self, seq: int) -> bool:
        """Would ``seq`` be accepted (not seen, not below the window)? Changes nothing."""
        if seq > self.highest:
            return True
        d = self.highest - seq
        return d < self.size and not (self.bits >> d) & 1

    def accept(self, seq: int) -> bool:
        """Record ``seq`` if it is fresh; False (record nothing) if it must be discarded."""
        if seq > self.highest:
            shift = seq - self.highest
            self.bits = (
                ((self.bits << shift) | 1) & ((1 << self.size) - 1) if shift < self.size else 1
            )
            self.highest = seq
            return True
        if not self.fresh(seq):
            return False
        self.bits |= 1 << (self.highest - seq)
        return True


@dataclass(slots=True)
class ServerContext:
    """One context the server has accepted (or is accepting: CONTINUE_INIT)."""

    handle: bytes
    mech: GssSecurityContext
    window: SequenceWindow
    established: bool = False
    principal: str = ""
    expires: float | None = None  # monotonic time; None: no expiry
    credentials: dict[int, Credential] = field(default_factory=dict)  # by service

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


class ContextTable:
    """Contexts by handle; the least recently used goes when the table is full."""

    def __init__(self, max_contexts: int = DEFAULT_MAX_CONTEXTS) -> None:
        self.max_contexts = max_contexts
        self._by_handle: OrderedDict[bytes, ServerContext] = OrderedDict()
        self._prefix = secrets.token_bytes(8)  # handles differ from one server run to the next
        self._next = 0

    def __len__(self) -> int:
        return len(self._by_handle)

    def create(self, mech: GssSecurityContext, window: int) -> ServerContext:
        self._next += 1
        handle = self._prefix + self._next.to_bytes(8, "big")
        ctx = ServerContext(handle, mech, SequenceWindow(window))
        self._by_handle[handle] = ctx
        while len(self._by_handle) > self.max_contexts:
            self._by_handle.popitem(last=False)
        return ctx

    def get(self, handle: bytes) -> ServerContext | None:
        ctx = self._by_handle.get(handle)
        if ctx is not None:
            self._by_handle.move_to_end(handle)
        return ctx

    def by_principal(self) -> dict[str, int]:
        """Established contexts per principal (for statistics and tests)."""
        out: dict[str, int] = {}
        for ctx in self._by_handle.values():
            if ctx.established:
                out[ctx.principal] = out.get(ctx.principal, 0) + 1
        return out

    def remove(self, handle: bytes) -> None:
        self._by_handle.pop(handle, None)
