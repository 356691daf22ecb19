"""The server's local admin socket: a Unix stream socket in the state directory, mode 0600,
answering only peers running as root or as the server's own user (checked with SO_PEERCRED).

The protocol is one request and one answer per connection, each a line of JSON:
``{"command": "stats"}`` → ``{"ok": true, "stats": {...}}``; a refusal or an unknown command →
``{"ok": false, "error": "..."}``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

SOCKET_NAME = "admin.sock"
MAX_REQUEST = 64 * 1024
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

Handler = Callable[[dict[str, Any]], dict[str, Any]]


def socket_path(state_dir: str) -> str:
    return os.path.join(os.path.realpath(state_dir), SOCKET_NAME)


def peer_uid(sock: socket.socket) -> int:
    """The effective uid of the process at the other end (SO_PEERCRED)."""
    _pid, uid, _gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return int(uid)


def may_ask(uid: int, server_uid: int) -> bool:
    return uid in (0, server_uid)


class AdminSocket:
    """Serve ``commands`` (name → handler) on ``path``; ``await start()``, ``await close()``."""

    def __init__(self, path: str, commands: dict[str, Handler]) -> None:
        self.path = path
        self.commands = commands
        self.server_uid = os.geteuid()
        self.refused = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> bool:
        """Listen; False (logged) when another live server already answers on the path."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        if _answers(self.path):
            log.warning("admin socket %s is in use by another server; not listening", self.path)
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o600)  # before the name others look for exists
            os.rename(tmp, self.path)
        except OSError:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=MAX_REQUEST)
        return True

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        await self._server.wait_closed()
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await self._answer(reader, writer)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> dict[str, Any]:
        line = await asyncio.wait_for(reader.readline(), 10)  # read first: no reset on close
        uid = peer_uid(writer.get_extra_info("socket"))
        if not may_ask(uid, self.server_uid):
            self.refused += 1
            log.warning("admin socket: uid %d refused", uid)
            return {"ok": False, "error": "permission denied"}
        try:
            request = json.loads(line)
            name = request["command"]
            handler = self.commands[name]
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "error": "unknown request"}
        return {"ok": True, **handler(request)}


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
        return True


def query(path: str, command: str = "stats", timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    """Ask the server listening on ``path``; its answer (raises OSError when refused)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(json.dumps({"command": command, **args}).encode() + b"\n")
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        raise ConnectionError(f"{path}: no answer")
    answer: dict[str, Any] = json.loads(data)
    if not answer.get("ok"):
        raise PermissionError(f"{path}: {answer.get('error', 'refused')}")
    return answer
