"""Send queue work requests that pyverbs makes once per queue pair and rewrites per post.

Every pyverbs object costs an allocation and a ``logging.getLogger`` (under the logging lock)
when made, and the loop thread posts a Send for every reply, with an RDMA Write ahead of it for
every Write chunk. ``ibv_post_send`` copies the work requests it is given, so the same objects
can go out again at once, whatever buffer they describe: a ``SendWR``'s ``sg_list`` setter
points the work request at the ``SGE``'s own ``struct ibv_sge`` (no copy), so rewriting that
``SGE``'s address, length and key rewrites the work request's scatter list. Kept per queue
pair: one Send per opcode and flags combination, one lone RDMA Read/Write (never linked to
another), as many chained RDMA Writes as the longest chain so far, and as many linked Sends
(a Send with another chain after it in a batch) as the longest batch so far; each chained or
linked object's ``next`` is set before every post, and the list-ending Sends' and the lone
one's never are (they always end their list).

Only for the pyverbs post path, where the post happens before the next one is built (the
``thread`` path queues posts and builds ctypes structures of its own). Multi-element
scatter lists get fresh objects (a ``SendWR`` can point at one ``SGE`` only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyverbs.enums as e
from pyverbs.wr import SGE, SendWR

from nfsrdma.transport.rdma.provider import RdmaWriteRequest, Sge

__all__ = ["Chain", "RdmaChain", "ReusedWrs", "SendChain"]


@dataclass(frozen=True, slots=True)
class SendChain:
    """A Send (with Invalidate when ``invalidate_rkey`` is set), the RDMA Writes ahead of it."""

    wr_id: int
    sges: Sequence[Sge]
    flags: int
    invalidate_rkey: int | None
    writes: Sequence[RdmaWriteRequest]


@dataclass(frozen=True, slots=True)
class RdmaChain:
    """An RDMA Read or Write by itself."""

    wr_id: int
    opcode: int
    sges: Sequence[Sge]
    remote_addr: int
    rkey: int
    flags: int


Chain = SendChain | RdmaChain


class _Slot:
    """One ``SendWR`` whose scatter list is its own ``SGE``."""

    __slots__ = ("sge", "wr")

    def __init__(self, opcode: int, flags: int = 0) -> None:
        self.sge = SGE(0, 0, 0)
        self.wr = SendWR(opcode=opcode, num_sge=1, sg=[self.sge], send_flags=flags)
        self.wr.sg_list = self.sge  # the work request now reads this SGE's element

    def point(self, wr_id: int, s: Sge) -> SendWR:
        """This slot's work request, as ``wr_id`` over ``s`` (opcode and flags unchanged)."""
        sge, wr = self.sge, self.wr
        sge.addr = s.addr
        sge.length = s.length
        sge.lkey = s.lkey
        wr.wr_id = wr_id
        return wr

    def fill(self, wr_id: int, opcode: int, s: Sge, flags: int) -> SendWR:
        wr = self.point(wr_id, s)
        wr.opcode = opcode
        wr.send_flags = flags
        return wr


class ReusedWrs:
    """The reusable work requests of one queue pair (see the module's docstring)."""

    def __init__(self) -> None:
        # One Send per opcode and flags in use (a handful), so a post rewrites only its
        # scatter element and wr_id.
        self._sends: dict[int, _Slot] = {}
        self._lone = _Slot(e.IBV_WR_RDMA_WRITE)
        self._links: list[_Slot] = []
        # Sends followed by another chain in a batch (held calls or replies): like the links,
        # their ``next`` is set before every post, so they never end a list.
        self._linked_sends: list[_Slot] = []
        self.made = 2  # pyverbs objects made so far (two per slot, one per fresh SGE and WR)
        # Fresh objects of the list being built: a SendWR's ``next`` is a bare C pointer, so
        # nothing else holds them until the post (kept until the next batch).
        self._fresh_wrs: list[SendWR] = []

    def send(
        self, wr_id: int, sges: Sequence[Sge], flags: int, invalidate_rkey: int | None
    ) -> SendWR:
        """The Send (with Invalidate when ``invalidate_rkey`` is given), ending any list."""
        opcode = e.IBV_WR_SEND if invalidate_rkey is None else e.IBV_WR_SEND_WITH_INV
        if len(sges) != 1:
            return self._fresh(wr_id, opcode, sges, flags, invalidate_rkey)
        key = flags | opcode << 16
        slot = self._sends.get(key)
        if slot is None:
            slot = self._sends[key] = _Slot(opcode, flags)
            self.made += 2
        wr = slot.point(wr_id, sges[0])
        if invalidate_rkey is not None:
            wr.imm_data = invalidate_rkey  # shares the union with invalidate_rkey
        return wr

    def lone(
        self, wr_id: int, opcode: int, sges: Sequence[Sge], remote_addr: int, rkey: int, flags: int
    ) -> SendWR:
        """An RDMA Read or Write posted by itself."""
        if len(sges) != 1:
            wr = self._fresh(wr_id, opcode, sges, flags, None)
        else:
            wr = self._lone.fill(wr_id, opcode, sges[0], flags)
        wr.set_wr_rdma(rkey, remote_addr)
        return wr

    def link(
        self,
        index: int,
        wr_id: int,
        sges: Sequence[Sge],
        remote_addr: int,
        rkey: int,
        flags: int,
        next_wr: SendWR,
    ) -> SendWR:
        """The ``index``-th RDMA Write of a chain, linked to ``next_wr``."""
        if len(sges) != 1:
            wr = self._fresh(wr_id, e.IBV_WR_RDMA_WRITE, sges, flags, None)
        else:
            links = self._links
            while len(links) <= index:
                links.append(_Slot(e.IBV_WR_RDMA_WRITE))
                self.made += 2
            wr = links[index].fill(wr_id, e.IBV_WR_RDMA_WRITE, sges[0], flags)
        wr.set_wr_rdma(rkey, remote_addr)
        wr.next_wr = next_wr
        return wr

    def chain(
        self,
        wr_id: int,
        sges: Sequence[Sge],
        flags: int,
        invalidate_rkey: int | None,
        writes: Sequence[RdmaWriteRequest],
    ) -> SendWR:
        """One Send and the RDMA Writes ahead of it, as a list of its own (the common post)."""
        fresh = self._fresh_wrs
        if fresh:
            fresh.clear()
        wr = self.send(wr_id, sges, flags, invalidate_rkey)
        for i in range(len(writes) - 1, -1, -1):
            w = writes[i]
            flags = e.IBV_SEND_SIGNALED if w.signaled else 0
            wr = self.link(i, w.wr_id, w.sges, w.remote_addr, w.rkey, flags, wr)
        return wr

    def batch(self, chains: Sequence[Chain]) -> SendWR:
        """``chains`` in order as one list (one ``ibv_post_send``). The last one ends the list
        and uses the reusable objects that end lists; a Send followed by another chain uses
        one of the linked Sends (reused likewise, by position), a lone RDMA work request so
        followed a fresh object (a list-ending one's ``next`` could not be cleared again)."""
        self._fresh_wrs.clear()
        nxt: SendWR | None = None
        index = 0  # chained RDMA Writes so far, each with its own reusable object
        sends = 0  # Sends linked to a chain after them so far, likewise
        for c in reversed(chains):
            if isinstance(c, SendChain):
                if nxt is None:
                    wr = self.send(c.wr_id, c.sges, c.flags, c.invalidate_rkey)
                else:
                    wr = self._linked_send(sends, c, nxt)
                    sends += 1
                for w in reversed(c.writes):
                    flags = e.IBV_SEND_SIGNALED if w.signaled else 0
                    wr = self.link(index, w.wr_id, w.sges, w.remote_addr, w.rkey, flags, wr)
                    index += 1
            elif nxt is None:
                wr = self.lone(c.wr_id, c.opcode, c.sges, c.remote_addr, c.rkey, c.flags)
            else:
                wr = self._fresh(c.wr_id, c.opcode, c.sges, c.flags, None)
                wr.set_wr_rdma(c.rkey, c.remote_addr)
                wr.next_wr = nxt
            nxt = wr
        if nxt is None:
            raise ValueError("nothing to post")
        return nxt

    def _linked_send(self, index: int, c: SendChain, next_wr: SendWR) -> SendWR:
        """The ``index``-th Send of a batch that another chain follows, linked to it."""
        opcode = e.IBV_WR_SEND if c.invalidate_rkey is None else e.IBV_WR_SEND_WITH_INV
        if len(c.sges) != 1:
            wr = self._fresh(c.wr_id, opcode, c.sges, c.flags, c.invalidate_rkey)
        else:
            slots = self._linked_sends
            while len(slots) <= index:
                slots.append(_Slot(e.IBV_WR_SEND))
                self.made += 2
            wr = slots[index].fill(c.wr_id, opcode, c.sges[0], c.flags)
            if c.invalidate_rkey is not None:
                wr.imm_data = c.invalidate_rkey  # shares the union with invalidate_rkey
        wr.next_wr = next_wr
        return wr

    def _fresh(
        self, wr_id: int, opcode: int, sges: Sequence[Sge], flags: int, imm: int | None
    ) -> SendWR:
        if not sges:
            raise ValueError("a work request needs at least one SGE")
        elements = [SGE(s.addr, s.length, s.lkey) for s in sges]
        self.made += len(elements) + 1
        wr = SendWR(
            wr_id=wr_id, opcode=opcode, num_sge=len(elements), sg=elements, send_flags=flags
        )
        if imm is not None:
            wr.imm_data = imm
        self._fresh_wrs.append(wr)
        return wr
