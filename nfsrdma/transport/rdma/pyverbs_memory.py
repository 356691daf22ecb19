"""Memory for the pyverbs provider: regions, type-2 memory windows, the protection domain.

Memory is our own anonymous ``mmap`` (or the caller's buffer) registered with
``MR(..., address=...)``, so ``MemoryRegion.buffer`` is a zero-copy view that stays valid after
deregistration. A pyverbs 44 ``MW`` can be bound once only (it always binds with
``ibv_inc_rkey`` of the allocation rkey): a window is allocated per registration.
"""

from __future__ import annotations

import ctypes
import mmap
import weakref

import pyverbs.enums as e
from pyverbs.mr import MR, MW
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError

from nfsrdma.transport.rdma.provider import (
    Access,
    DeviceCaps,
    ProviderError,
    RegionBase,
    check_length,
    registrable,
)

__all__ = ["PyverbsPD", "PyverbsRegion", "PyverbsWindow"]


def _address_of(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class PyverbsRegion(RegionBase):
    def __init__(self, mr: MR, view: memoryview, addr: int, access: Access) -> None:
        super().__init__(view, addr, int(mr.lkey), int(mr.rkey), access)
        self.mr = mr

    def _release(self) -> None:
        self.mr.close()  # ibv_dereg_mr; the memory is ours (or the caller's) and stays valid


class PyverbsWindow:
    def __init__(self, mw: MW) -> None:
        self.mw = mw
        self._rkey: int | None = None

    @property
    def rkey(self) -> int | None:
        return self._rkey

    def bound(self, rkey: int) -> None:
        self._rkey = rkey

    def close(self) -> None:
        self.mw.close()


class PyverbsPD:
    def __init__(self, pd: PD, caps: DeviceCaps) -> None:
        self.pd = pd
        self._caps = caps
        self._regions: weakref.WeakSet[PyverbsRegion] = weakref.WeakSet()

    def register(self, length: int, access: Access) -> PyverbsRegion:
        check_length(length)
        return self._register(memoryview(mmap.mmap(-1, length)), access)

    def register_buffer(self, buffer: memoryview, access: Access) -> PyverbsRegion:
        return self._register(registrable(buffer), access)

    def _register(self, view: memoryview, access: Access) -> PyverbsRegion:
        addr = _address_of(view)
        try:
            mr = MR(self.pd, len(view), int(access), address=addr)
        except PyverbsError as exc:
            raise ProviderError(f"memory registration failed: {exc}") from exc
        region = PyverbsRegion(mr, view, addr, access)
        self._regions.add(region)
        return region

    def alloc_window(self) -> PyverbsWindow:
        if not self._caps.memory_windows:
            raise ProviderError("memory windows not supported")
        try:
            return PyverbsWindow(MW(self.pd, e.IBV_MW_TYPE_2))
        except PyverbsError as exc:
            raise ProviderError(f"cannot allocate a memory window: {exc}") from exc

    def close(self) -> None:
        for region in list(self._regions):
            region.deregister()
        self.pd.close()
