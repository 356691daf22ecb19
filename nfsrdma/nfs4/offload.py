"""Asynchronous COPYs in progress and done (RFC 7862 sections 4.8, 15.2, 15.8, 15.9).

Each asynchronous COPY gets a stateid of its own (the ``wr_callback_id`` the client names in
OFFLOAD_STATUS and OFFLOAD_CANCEL, and the server in CB_OFFLOAD); only the client that started
it may ask about it. Finished copies are kept (at most ``keep_done``, oldest forgotten first)
so that a client that missed CB_OFFLOAD can still learn the outcome with OFFLOAD_STATUS. A
copy runs to its end even when its client goes away (the CB_OFFLOAD then finds no one); the
server's shutdown cancels every copy.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4

_MARK: Final = b"\xc0\x9f"  # first octets of every copy stateid's ``other``


@dataclass(eq=False)
class Offload:
    stateid: nfs4.stateid4
    clientid: int
    dst_fh: bytes
    total: int  # octets asked for
    copied: int = 0  # octets copied so far
    status: int | None = None  # the outcome, once finished
    cancelled: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.status is not None


class Offloads:
    def __init__(self, keep_done: int = 256) -> None:
        self.keep_done = keep_done
        self._running: dict[bytes, Offload] = {}
        self._done: OrderedDict[bytes, Offload] = OrderedDict()

    def __len__(self) -> int:
        return len(self._running)

    def start(self, clientid: int, dst_fh: bytes, total: int) -> Offload:
        other = _MARK + os.urandom(10)
        o = Offload(nfs4.stateid4(1, other), clientid, dst_fh, total)
        self._running[other] = o
        return o

    def finish(self, o: Offload, status: int) -> None:
        o.status = status
        if self._running.pop(o.stateid.other, None) is None:
            return
        self._done[o.stateid.other] = o
        while len(self._done) > self.keep_done:
            self._done.popitem(last=False)

    def find(self, clientid: int, sid: nfs4.stateid4) -> Offload:
        """The copy ``sid`` names, of this client (NFS4ERR_BAD_STATEID otherwise)."""
        other = bytes(sid.other)
        o = self._running.get(other) or self._done.get(other)
        if o is None or o.clientid != clientid:
            raise Nfs4Error(nfs4.NFS4ERR_BAD_STATEID)
        return o

    def cancel(self, o: Offload) -> None:
        o.cancelled = True
        if o.task is not None and not o.task.done():
            o.task.cancel()

    def cancel_all(self) -> None:
        for o in list(self._running.values()):
            self.cancel(o)
