"""nfsrdma: an asyncio NFSv4.1 client and server over RPC-over-RDMA version 1 and TCP.

``nfsrdma.connect("nfs://host/path")`` opens the async client (see :mod:`nfsrdma.client`);
it is imported on first use, so ``import nfsrdma`` stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "connect"]

if TYPE_CHECKING:
    from nfsrdma.client import connect


def __getattr__(name: str) -> Any:
    if name == "connect":
        from nfsrdma.client import connect

        return connect
    raise AttributeError(f"module 'nfsrdma' has no attribute {name!r}")
