"""RPC-over-RDMA version 1 transport.

The bottom of the stack, by job (as Linux splits xprtrdma and svcrdma):

- protocol, sans-IO: ``header`` (the transport header codec), ``marshal`` (chunk planning),
  ``credits``, ``privdata`` (RFC 8797 private data);
- the connection: ``connection_base`` (buffers, set-up steps, receive path, teardown),
  ``requester`` and ``responder`` (the two directions), ``calls`` (per-call state),
  ``endpoint`` (``RdmaConnection``, ``connect_rdma``, ``RdmaListener``), ``pool``
  (pre-registered buffers);
- the verbs boundary: ``provider`` (the interface every provider implements, and the parts
  they share), ``pyverbs_*`` with ``rdmacm`` (rdma-core's pyverbs and librdmacm, for real
  devices; not imported here) and ``inproc*`` (an in-process emulation for unit tests),
  ``devices`` (finding RDMA devices and their addresses).
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
