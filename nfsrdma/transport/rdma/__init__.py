"""RPC-over-RDMA version 1 transport.

The bottom of the stack: the verbs provider interface (``provider``), its providers
(``pyverbs_provider`` for real devices, ``inproc`` for unit tests), pre-registered buffer pools
(``pool``) and the RFC 8797 private data codec (``privdata``). ``pyverbs_provider`` is not
imported here: it needs rdma-core's pyverbs.
"""

from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectError,
    Connection,
    ConnectionEvent,
    ConnectionRejected,
    ConnectRequest,
    Device,
    DeviceCaps,
    Disconnected,
    EventHandler,
    Listener,
    MemoryRegion,
    MemoryWindow,
    ProtectionDomain,
    ProviderError,
    QueuePairConfig,
    Sge,
    WcOpcode,
    WcStatus,
)

__all__ = [
    "Access",
    "Completion",
    "ConnectError",
    "ConnectRequest",
    "Connection",
    "ConnectionEvent",
    "ConnectionRejected",
    "Device",
    "DeviceCaps",
    "Disconnected",
    "EventHandler",
    "Listener",
    "MemoryRegion",
    "MemoryWindow",
    "ProtectionDomain",
    "ProviderError",
    "QueuePairConfig",
    "Sge",
    "WcOpcode",
    "WcStatus",
]
