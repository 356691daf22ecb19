"""Our client under our server's restart (RFC 8881 section 8.4.2; issue 11 section 2): the
server instance goes away (its state with it, its client records stay in the state dir) and
another starts on the same export, state dir and port. The client finds its client ID gone,
reclaims its open (CLAIM_PREVIOUS) and its lock (reclaim set) in the grace period, sends
RECLAIM_COMPLETE (which ends grace: it was the only recorded client) and carries on with the
same file object; the reclaimed lock still refuses a second client."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest

import nfsrdma.client as nc
import nfsrdma.server as server_module
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.transport.tcp import listen_tcp


def _server(tmp_path: Path, port: int = 0) -> NFSServer:
    return NFSServer(
        str(tmp_path / "export"),
        bind="127.0.0.1",
        tcp_port=port,
        rdma_port=None,
        root_squash=False,
        state_dir=str(tmp_path / "state"),
        config=ServerConfig(lease_time=10),
    )


async def test_our_client_reclaims_open_and_lock_after_our_server_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "export").mkdir()
    listening: list[float] = []  # when each instance's listener was up

    async def listen_and_note(*args: Any, **kwargs: Any) -> Any:
        srv = await listen_tcp(*args, **kwargs)
        listening.append(time.monotonic())
        return srv

    monkeypatch.setattr(server_module, "listen_tcp", listen_and_note)
    first_data, second_data = os.urandom(200_000), os.urandom(100_000)
    server = _server(tmp_path)
    await server.start()
    port = server.tcp_port
    url = f"nfs://127.0.0.1:{port}/"
    try:
        async with nc.connect(url, uid=0, gid=0, timeout=2.0) as fs:
            f = await fs.open("f", "wb")
            await f.write(first_data)
            await f.fsync()
            await f.lock(0, 100)
            await server.close()  # the instance and its state go; the records stay
            server = _server(tmp_path, port)
            await server.start()
            assert server.state is not None
            grace = server.state.grace
            assert grace.previous == {fs.session.opts.owner} and grace.ended_why == ""
            # the period runs from when connections were accepted, not from the start's first
            # step (a slow start must not eat the clients' time to reclaim)
            assert grace.ends_at >= listening[-1] + server.config.grace_seconds
            await f.write(second_data)  # the same file object, after the restart
            await f.fsync()
            s = fs.session.stats
            assert (s.clients, s.reclaim_attempts, s.reclaimed, s.reopens) == (2, 1, 1, 0)
            assert f.locks, "the lock was not reclaimed"
            assert grace.ended_why == "every client reclaimed"
            async with nc.connect(url, uid=0, gid=0, timeout=2.0) as other:
                g = await other.open("f", "rb")
                with pytest.raises(OSError) as e:
                    await g.lock(0, 100, exclusive=False)
                assert e.value.errno in (errno.EAGAIN, errno.EACCES)
                await g.close()
            await f.close()
        assert (tmp_path / "export" / "f").read_bytes() == first_data + second_data
    finally:
        await server.close()
