"""The admin socket: mode 0600 in its directory, answers root and the server's own user only
(SO_PEERCRED), one JSON request and answer per connection."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.stats.admin import AdminSocket, query, socket_path

NOBODY = 65534

# Run as another user: connect, send a request, print what happened (stdlib only).
_ASK = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(json.dumps({"connect_error": e.errno})); sys.exit()
s.sendall(b'{"command": "stats"}\\n')
data = b""
while chunk := s.recv(65536):
    data += chunk
print(data.decode().strip())
"""


def _as_nobody(path: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-I", "-c", _ASK, path],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def _handler(request: dict[str, Any]) -> dict[str, Any]:
    return {"stats": {"echo": request}}


async def test_owner_asks_and_gets_an_answer(tmp_path: Path) -> None:
    path = socket_path(str(tmp_path / "state"))
    admin = AdminSocket(path, {"stats": _handler})
    assert await admin.start()
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        answer = await asyncio.to_thread(query, path, "stats", buckets=True)
        assert answer == {"ok": True, "stats": {"echo": {"command": "stats", "buckets": True}}}
        with pytest.raises(PermissionError, match="unknown request"):
            await asyncio.to_thread(query, path, "reboot")
        # A second server on the same state directory does not take the socket away.
        other = AdminSocket(path, {"stats": _handler})
        assert not await other.start()
        assert (await asyncio.to_thread(query, path))["ok"]
    finally:
        await admin.close()
    assert not os.path.exists(path)


async def test_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = socket_path(str(tmp_path))
    Path(path).write_bytes(b"")  # left behind by a server that died
    admin = AdminSocket(path, {"stats": _handler})
    assert await admin.start()
    try:
        assert (await asyncio.to_thread(query, path))["ok"]
    finally:
        await admin.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
async def test_other_users_are_refused() -> None:
    top = tempfile.mkdtemp(prefix="nfsrdma-admin-")  # every directory up to it traversable
    os.chmod(top, 0o755)
    state = os.path.join(top, "state")
    path = socket_path(state)
    admin = AdminSocket(path, {"stats": _handler})
    assert await admin.start()
    try:
        # The file mode keeps other users out (the directory is opened up to show it)...
        os.chmod(state, 0o755)
        answer = await asyncio.to_thread(_as_nobody, path)
        assert answer == {"connect_error": 13}  # EACCES
        # ... and were the socket opened up, the peer credentials would.
        os.chmod(path, 0o666)
        answer = await asyncio.to_thread(_as_nobody, path)
        assert answer == {"ok": False, "error": "permission denied"}
        assert admin.refused == 1
    finally:
        await admin.close()
        shutil.rmtree(top)
