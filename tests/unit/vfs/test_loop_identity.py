"""The server's loop thread and file-system identities: protected (calls for other identities
handed to the identity worker) only when it drives RDMA; a TCP-only server switches in place,
and every call still runs as its own (squashed) caller."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import nfsrdma.client as nc
from nfsrdma.server import NFSServer
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.vfs import identity

from .conftest import needs_root

pytestmark = needs_root


def _in_fresh_thread(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run ``scenario`` in an event loop of its own thread (never protected before)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(scenario())  # type: ignore[arg-type]
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if failure:
        raise failure[0]


def test_a_tcp_only_server_switches_identity_in_place(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    export.chmod(0o777)
    seen: dict[str, object] = {}

    async def scenario() -> None:
        async with NFSServer(
            str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None,
            state_dir=str(tmp_path / "state"), root_squash=True,
        ) as server:  # fmt: skip
            before = identity.handoffs()
            url = f"nfs://127.0.0.1:{server.tcp_port}/"
            for uid in (1000, 0, 1001, 1000):
                async with nc.connect(url, uid=uid, gid=uid) as fs:
                    await fs.write_bytes(f"by{uid}", b"x")
            seen["protected"] = identity.is_protected()
            seen["handoffs"] = identity.handoffs() - before

    _in_fresh_thread(scenario)
    assert seen == {"protected": False, "handoffs": 0}
    owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in export.iterdir()}
    assert owners == {
        "by1000": (1000, 1000),
        "by0": (65534, 65534),  # root squashed
        "by1001": (1001, 1001),
    }
    assert os.access(export / "by1000", os.R_OK)  # the test's own thread is still root


def test_an_rdma_server_protects_its_loop_thread(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    seen: list[bool] = []

    async def scenario() -> None:
        fabric = InprocFabric()
        async with NFSServer(
            str(export), bind="127.0.0.1", tcp_port=0, rdma_port=20049,
            rdma_device=fabric.device("10.9.2.1"), state_dir=str(tmp_path / "state"),
        ):  # fmt: skip
            seen.append(identity.is_protected())

    _in_fresh_thread(scenario)
    assert seen == [True]
