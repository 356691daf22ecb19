"""Shared set-up for provider tests: an event recorder and a connected in-process pair."""

from __future__ import annotations

import asyncio
import ctypes
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from nfsrdma.transport.rdma.endpoint import RdmaConnection
from nfsrdma.transport.rdma.header import Segment
from nfsrdma.transport.rdma.inproc import InprocDevice, InprocFabric
from nfsrdma.transport.rdma.inproc_qp import InprocConnection
from nfsrdma.transport.rdma.provider import (
    Access,
    Completion,
    ConnectionEvent,
    Disconnected,
    QueuePairConfig,
)


class Patchable(RdmaConnection):
    """An ``RdmaConnection`` whose methods a test may replace on the instance (``conn._send =
    spy``), in both builds. Compiled, ``RdmaConnection`` calls its own methods directly; for an
    interpreted subclass like this one it calls them through Python attribute look-up, where
    the instance's attributes come first. Made by ``connect_rdma(..., connection=Patchable)``
    and ``RdmaListener(..., connection=Patchable)``."""


PORT = 20049
CONFIG = QueuePairConfig(max_send_wr=16, max_recv_wr=16, max_send_sge=4, max_inline_data=64)
ALL = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_WRITE
# Up to three segments of a chunk list (hypothesis), for the planning and checking tests.
SEGMENTS = st.lists(
    st.builds(Segment, st.integers(1, 2**32 - 1), st.integers(0, 6000), st.integers(0, 2**40)),
    max_size=3,
)


class Events:
    """Records a connection's events; ``inside_post`` catches re-entrant delivery."""

    def __init__(self) -> None:
        self.items: list[ConnectionEvent] = []
        self.inside_post = False
        self.reentrant = False
        self._changed = asyncio.Event()

    def __call__(self, event: ConnectionEvent) -> None:
        if self.inside_post:
            self.reentrant = True
        self.items.append(event)
        self._changed.set()

    @property
    def completions(self) -> list[Completion]:
        return [e for e in self.items if isinstance(e, Completion)]

    @property
    def disconnects(self) -> list[Disconnected]:
        return [e for e in self.items if isinstance(e, Disconnected)]

    def by_id(self, wr_id: int) -> Completion:
        found = [c for c in self.completions if c.wr_id == wr_id]
        assert len(found) == 1, f"wr_id {wr_id}: {found}"
        return found[0]

    async def wait(self, predicate: Callable[[Events], bool], timeout: float = 2.0) -> None:
        async def loop() -> None:
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    async def wait_completion(self, wr_id: int) -> Completion:
        await self.wait(lambda ev: any(c.wr_id == wr_id for c in ev.completions))
        return self.by_id(wr_id)

    async def wait_disconnect(self) -> Disconnected:
        await self.wait(lambda ev: bool(ev.disconnects))
        return self.disconnects[0]


@dataclass
class Pair:
    fabric: InprocFabric
    client_dev: InprocDevice
    server_dev: InprocDevice
    client: InprocConnection
    server: InprocConnection
    client_events: Events
    server_events: Events
    client_pd_received: bytes  # the accept's private data, as the client saw it
    server_pd_received: bytes  # the connect request's private data, as the server saw it


async def connect_pair(
    *,
    client_pd: bytes = b"",
    server_pd: bytes = b"",
    client_recvs: Callable[[InprocConnection], None] | None = None,
    server_recvs: Callable[[InprocConnection], None] | None = None,
    client_rr: int = 4,
    client_id: int = 0,
    server_rr: int = 0,
    server_id: int = 4,
    rnr_retry: int = 7,
    fabric: InprocFabric | None = None,
) -> Pair:
    fabric = fabric or InprocFabric()
    client_dev = fabric.device("10.0.0.2")
    server_dev = fabric.device("10.0.0.1")
    listener = await server_dev.listen(PORT)
    ce, se = Events(), Events()
    client = await client_dev.resolve("10.0.0.1", PORT, CONFIG, ce)
    if client_recvs:
        client_recvs(client)

    async def serve() -> tuple[InprocConnection, bytes]:
        request = await listener.get_request()
        conn = request.create_connection(CONFIG, se)
        if server_recvs:
            server_recvs(conn)
        got = await conn.establish(
            server_pd,
            responder_resources=server_rr,
            initiator_depth=server_id,
            rnr_retry=rnr_retry,
        )
        return conn, got

    task = asyncio.ensure_future(serve())
    accepted = await client.establish(
        client_pd, responder_resources=client_rr, initiator_depth=client_id, rnr_retry=rnr_retry
    )
    server, got = await task
    return Pair(fabric, client_dev, server_dev, client, server, ce, se, accepted, got)


def verbs_header_layout(work: Path, probe: str) -> dict[str, int]:
    """Compile and run ``probe`` (C printing "name value" lines about <infiniband/verbs.h>)
    in ``work``; its lines as a dictionary. Fails without a C compiler or the header."""
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler (scripts/setup.sh installs build-essential)"
    assert Path("/usr/include/infiniband/verbs.h").exists(), "libibverbs-dev is not installed"
    (work / "probe.c").write_text(probe)
    subprocess.run([cc, "-o", str(work / "probe"), str(work / "probe.c")], check=True)
    out = subprocess.run([str(work / "probe")], check=True, capture_output=True, text=True)
    return {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}


class FakeContext(ctypes.Structure):
    """A provider's ``struct ibv_context`` as far as ``verbs_direct``/``verbs_poll`` read it
    (a ctypes object's own memory holds the pointer to its buffer, as a pyverbs object holds
    its ``ibv_*`` pointer)."""

    _fields_ = (
        ("device", ctypes.c_void_p),
        ("ops", ctypes.c_void_p * 32),
        ("cmd_fd", ctypes.c_int),
        ("async_fd", ctypes.c_int),
    )
