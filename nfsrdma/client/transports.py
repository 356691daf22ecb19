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


class _SharedDevice:
    """An opened RDMA device shared by the client connections of one event loop; closed when
    the last of them is gone."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.users = 0


_devices: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SharedDevice] = (
    weakref.WeakKeyDictionary()
)


class RdmaUnavailable(NotImplementedError):
    """RPC-over-RDMA cannot be used here (no pyverbs, or no RDMA device with an address)."""


async def connect_rdma(
    host: str, port: int, *, rtrext: bool = True, rtrext_tbsn: bool = False, options: Any = None
) -> Connection:
    """An RPC-over-RDMA v1 connection to ``host:port`` through this host's RDMA device (the
    first with an IPv4 address). The requester implements the same ``Connection`` interface as
    TCP: READ results land in ``ReplyExpectation.sinks`` through Write chunks, WRITE data
    leaves as Read chunks. Connection failures are ConnectionError (the session retries).
    ``rtrext`` offers the rtrext extension (message continuation, RT-X1) in the private data;
    only an nfsrdma server takes it up; ``rtrext_tbsn`` also sends WRITE data by send-based
    placement when the server accepts it (docs/rtrext.md). ``options`` (an ``RdmaOptions``)
    replaces the defaults, ``rtrext`` included (the conformance harness provisions connections
    its way)."""
    try:
        from nfsrdma.transport.rdma.connection_base import RdmaOptions
        from nfsrdma.transport.rdma.devices import find_address
        from nfsrdma.transport.rdma.endpoint import connect_rdma as rdma_connect
        from nfsrdma.transport.rdma.provider import ProviderError
        from nfsrdma.transport.rdma.pyverbs_provider import open_device
    except ImportError as e:
        raise RdmaUnavailable(f"rdma://{host}:{port}: RPC-over-RDMA needs pyverbs ({e})") from e
    loop = asyncio.get_running_loop()
    shared = _devices.get(loop)
    if shared is None:
        found = find_address()
        if found is None:
            raise RdmaUnavailable(
                f"rdma://{host}:{port}: no RDMA device with an IPv4 address on this host"
            )
        try:
            device = await open_device(found[1])
        except ProviderError as e:
            raise ConnectionError(f"rdma://{host}:{port}: {e}") from e
        shared = _devices[loop] = _SharedDevice(device)
    shared.users += 1  # counted while connecting, so a parallel failure does not close it
    try:
        opts = (
            options if options is not None else RdmaOptions(rtrext=rtrext, rtrext_tbsn=rtrext_tbsn)
        )
        conn = await rdma_connect(shared.device, host, port, opts)
    except BaseException as e:
        _drop_user(loop, shared)
        if isinstance(e, ProviderError):
            raise ConnectionError(f"rdma://{host}:{port}: {e}") from e
        raise

    def closed(c: Connection, exc: BaseException | None) -> None:
        loop.call_soon(_drop_user, loop, shared)  # not from inside the connection's own close

    conn.on_closed(closed)
    return conn


def _drop_user(loop: asyncio.AbstractEventLoop, shared: _SharedDevice) -> None:
    shared.users -= 1
    if shared.users <= 0:
        _release(loop, shared)


def _release(loop: asyncio.AbstractEventLoop, shared: _SharedDevice) -> None:
    if _devices.get(loop) is shared:
        del _devices[loop]
    shared.device.close()


async def open_connection(
    url: NfsUrl, *, rtrext: bool = True, rtrext_tbsn: bool = False
) -> Connection:
    """A new transport connection for ``url`` (``rtrext``, ``rtrext_tbsn``: see
    ``connect_rdma``)."""
    if url.transport == "rdma":
        return await connect_rdma(url.host, url.port, rtrext=rtrext, rtrext_tbsn=rtrext_tbsn)
    return await connect_tcp(url.host, url.port, max_record=MAX_RECORD)
