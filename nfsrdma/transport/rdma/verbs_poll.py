"""Polling a completion queue without pyverbs objects: ``ibv_poll_cq`` through ctypes.

pyverbs's ``CQ.poll`` calls ``ibv_poll_cq`` once per completion and makes a ``WC`` object for
each (an allocation, thirteen property sets and a ``logging.getLogger`` under the logging lock),
which the provider then reads field by field; a profile of the server in the test bed shows
this on the loop thread for every receive and Send. ``ibv_poll_cq`` is a static inline of
``<infiniband/verbs.h>``: ``cq->context->ops.poll_cq(cq, n, wc)``. ``CqPoller`` calls that
function pointer once per batch into one preallocated array of ``struct ibv_wc`` and unpacks
each completion as a tuple of integers (the layout is checked against the installed header by a
host test). The ``struct ibv_cq *`` is found inside the pyverbs ``CQ`` by content, as
``verbs_direct`` finds the queue pair; when it is not found the caller polls through pyverbs.
"""

from __future__ import annotations

import ctypes
import struct

from nfsrdma.transport.rdma.verbs_direct import (
    CONTEXT_POLL_CQ_OFFSET,
    DirectUnavailable,
    locate_cq,
)

__all__ = ["WC_SIZE", "CqPoller", "WcRow"]

# struct ibv_wc: wr_id, status, opcode, vendor_err, byte_len, imm_data (a union with
# invalidated_rkey), qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits.
_WC = struct.Struct("=QIIIIIIIIHHBBxx")
WC_SIZE = _WC.size  # 48

# (wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags, ...)
WcRow = tuple[int, ...]

_PollCq = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


class CqPoller:
    """``ibv_poll_cq`` of one CQ into a preallocated batch (called with the GIL held: the poll
    reads a completion ring in user memory)."""

    def __init__(self, context: object, cq: object, batch: int) -> None:
        ctx_ptr, self._cq_ptr = locate_cq(context, cq)
        fn = ctypes.c_void_p.from_address(ctx_ptr + CONTEXT_POLL_CQ_OFFSET).value
        if not fn:
            raise DirectUnavailable("the provider has no poll_cq")
        self._poll_cq = _PollCq(fn)
        self.batch = batch
        self._wcs = ctypes.create_string_buffer(WC_SIZE * batch)
        self._view = memoryview(self._wcs).cast("B")

    def poll(self) -> list[WcRow]:
        """Up to ``batch`` completions, oldest first. Raises ``OSError`` if the poll fails."""
        n = int(self._poll_cq(self._cq_ptr, self.batch, self._wcs))
        if n < 0:
            raise OSError(-n, "ibv_poll_cq failed")
        if n == 0:
            return []
        return list(_WC.iter_unpack(self._view[: n * WC_SIZE]))
