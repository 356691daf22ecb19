"""Memory of the in-process provider: registered regions, type-2 memory windows, and the
protection domain that translates keys and addresses as an HCA does (bounds, access rights,
windows bound to one queue pair, invalidation)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from nfsrdma.transport.rdma.provider import (
    Access,
    ProviderError,
    RegionBase,
    Sge,
    WcStatus,
    check_length,
    registrable,
)

if TYPE_CHECKING:
    from nfsrdma.transport.rdma.inproc import InprocDevice
    from nfsrdma.transport.rdma.inproc_qp import InprocConnection

__all__ = ["InprocPD", "InprocRegion", "InprocWindow", "WcError"]

_PAGE = 4096


class WcError(Exception):
    """A work request failed. ``peer_*`` describe what the failure does at the responder: the
    status of the receive it consumed, and whether its queue pair breaks too."""

    def __init__(
        self,
        status: WcStatus,
        reason: str,
        *,
        peer_breaks: bool = False,
        peer_status: WcStatus | None = None,
        peer_recv: int | None = None,
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.peer_breaks = peer_breaks
        self.peer_status = peer_status
        self.peer_recv = peer_recv


class InprocRegion(RegionBase):
    """A registered region; ``buffer`` is the backing memory itself (no copies)."""

    def __init__(
        self, pd: InprocPD, memory: memoryview, addr: int, key: int, access: Access
    ) -> None:
        super().__init__(memory, addr, key, key, access)
        self._pd = pd

    def _release(self) -> None:
        self._pd._forget(self._lkey)

    def _slice(self, addr: int, length: int) -> memoryview | None:
        start = addr - self._addr
        if start < 0 or length < 0 or start + length > len(self._view):
            return None
        return self._view[start : start + length]


class InprocWindow:
    """A type-2 memory window: bound once, then invalidated and closed."""

    def __init__(self, pd: InprocPD) -> None:
        self._pd = pd
        self._rkey: int | None = None
        self._region: InprocRegion | None = None
        self._addr = 0
        self._length = 0
        self._access = Access(0)
        self._qp: InprocConnection | None = None
        self._valid = False
        self._closed = False

    @property
    def rkey(self) -> int | None:
        return self._rkey

    @property
    def valid(self) -> bool:
        return self._valid

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._valid = False
            if self._rkey is not None:
                self._pd._forget(self._rkey)

    def _slice(self, addr: int, length: int) -> memoryview | None:
        if self._region is None or not self._region.registered:
            return None
        if addr < self._addr or addr + length > self._addr + self._length or length < 0:
            return None
        return self._region._slice(addr, length)


class InprocPD:
    """Protection domain: key tables and a private virtual address space."""

    def __init__(self, device: InprocDevice, index: int) -> None:
        self._device = device
        self._objects: dict[int, InprocRegion | InprocWindow] = {}
        # Key ranges and addresses differ per device so one side's keys never work on the other.
        self._key_index = itertools.count((index + 1) << 12)
        self._next_addr = 0x7F00_0000_0000 + index * 0x10_0000_0000

    def _new_key(self) -> int:
        return (next(self._key_index) << 8) | 0x5A

    def _forget(self, key: int) -> None:
        self._objects.pop(key, None)

    def _place(self, length: int) -> int:
        addr = self._next_addr
        pages = (length + _PAGE - 1) // _PAGE + 1  # one unmapped guard page after each
        self._next_addr += pages * _PAGE
        return addr

    def register(self, length: int, access: Access) -> InprocRegion:
        check_length(length)
        return self.register_buffer(memoryview(bytearray(length)), access)

    def register_buffer(self, buffer: memoryview, access: Access) -> InprocRegion:
        view = registrable(buffer)
        if access & (Access.REMOTE_WRITE) and not access & Access.LOCAL_WRITE:
            raise ProviderError("REMOTE_WRITE requires LOCAL_WRITE (EINVAL)")
        region = InprocRegion(self, view, self._place(len(view)), self._new_key(), access)
        self._objects[region.lkey] = region
        return region

    def alloc_window(self) -> InprocWindow:
        if not self._device.caps.memory_windows:
            raise ProviderError("memory windows not supported (EOPNOTSUPP)")
        return InprocWindow(self)

    # Address translation, as the HCA does it.

    def local(self, sge: Sge, write: bool) -> memoryview:
        obj = self._objects.get(sge.lkey)
        if not isinstance(obj, InprocRegion):
            raise WcError(WcStatus.LOC_PROT_ERR, f"lkey {sge.lkey:#x} unknown")
        if write and not obj.access & Access.LOCAL_WRITE:
            raise WcError(WcStatus.LOC_PROT_ERR, f"lkey {sge.lkey:#x} lacks LOCAL_WRITE")
        view = obj._slice(sge.addr, sge.length)
        if view is None:
            raise WcError(WcStatus.LOC_PROT_ERR, f"SGE {sge.addr:#x}+{sge.length} out of bounds")
        return view

    def remote(
        self, rkey: int, addr: int, length: int, need: Access, via: InprocConnection
    ) -> memoryview:
        obj = self._objects.get(rkey)
        bad = WcStatus.REM_ACCESS_ERR
        if obj is None:
            raise WcError(bad, f"rkey {rkey:#x} unknown or invalidated")
        if isinstance(obj, InprocWindow):
            if not obj.valid:
                raise WcError(bad, f"window rkey {rkey:#x} invalidated")
            if obj._qp is not via:
                raise WcError(bad, f"window rkey {rkey:#x} bound to another queue pair")
            rights = obj._access
        else:
            rights = obj.access
        if not rights & need:
            raise WcError(bad, f"rkey {rkey:#x} lacks {need!r}")
        view = obj._slice(addr, length)
        if view is None:
            raise WcError(bad, f"rkey {rkey:#x}: {addr:#x}+{length} out of bounds")
        return view

    def bind(
        self,
        window: InprocWindow,
        region: InprocRegion,
        addr: int,
        length: int,
        access: Access,
        qp: InprocConnection,
    ) -> None:
        if window._closed or window._pd is not self or region._pd is not self:
            raise WcError(WcStatus.MW_BIND_ERR, "window or region from another PD")
        if not region.registered or not region.access & Access.MW_BIND:
            raise WcError(WcStatus.MW_BIND_ERR, "region not registered with MW_BIND")
        if region._slice(addr, length) is None:
            raise WcError(WcStatus.MW_BIND_ERR, "window outside its region")
        if access & Access.REMOTE_WRITE and not region.access & Access.LOCAL_WRITE:
            raise WcError(WcStatus.MW_BIND_ERR, "REMOTE_WRITE window on read-only region")
        window._region = region
        window._addr = addr
        window._length = length
        window._access = access
        window._qp = qp
        window._valid = True

    def invalidate(self, rkey: int, qp: InprocConnection) -> bool:
        obj = self._objects.get(rkey)
        if not isinstance(obj, InprocWindow) or not obj.valid or obj._qp is not qp:
            return False
        obj._valid = False
        return True
