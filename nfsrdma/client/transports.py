"""Which transport a URL uses: ``nfs://`` TCP, ``rdma://`` RPC-over-RDMA v1 (RFC 8166).

``open_connection(url)`` is called for the first connection and again for every reconnect.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from nfsrdma.client.url import NfsUrl
from nfsrdma.transport.base import Connection
from nfsrdma.transport.tcp import connect_tcp

# Large enough for a 1 MiB READ reply and its headers.
MAX_RECORD = 8 << 20

# One opened RDMA device per event loop, shared by every client connection on it.
_devices: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


class RdmaUnavailable(NotImplementedError):
    """RPC-over-RDMA cannot be used here (no pyverbs, or no RDMA device with an address)."""


async def connect_rdma(host: str, port: int) -> Connection:
    """An RPC-over-RDMA v1 connection to ``host:port`` through this host's RDMA device (the
    first with an IPv4 address). The requester implements the same ``Connection`` interface as
    TCP: READ results land in ``ReplyExpectation.sinks`` through Write chunks, WRITE data
    leaves as Read chunks. Connection failures are ConnectionError (the session retries)."""
    try:
        from nfsrdma.transport.rdma.devices import find_address
        from nfsrdma.transport.rdma.endpoint import connect_rdma as rdma_connect
        from nfsrdma.transport.rdma.provider import ProviderError
        from nfsrdma.transport.rdma.pyverbs_provider import open_device
    except ImportError as e:
        raise RdmaUnavailable(f"rdma://{host}:{port}: RPC-over-RDMA needs pyverbs ({e})") from e
    loop = asyncio.get_running_loop()
    device = _devices.get(loop)
    try:
        if device is None:
            found = find_address()
            if found is None:
                raise RdmaUnavailable(
                    f"rdma://{host}:{port}: no RDMA device with an IPv4 address on this host"
                )
            device = await open_device(found[1])
            _devices[loop] = device
        return await rdma_connect(device, host, port)
    except ProviderError as e:
        raise ConnectionError(f"rdma://{host}:{port}: {e}") from e


async def open_connection(url: NfsUrl) -> Connection:
    """A new transport connection for ``url``."""
    if url.transport == "rdma":
        return await connect_rdma(url.host, url.port)
    return await connect_tcp(url.host, url.port, max_record=MAX_RECORD)
