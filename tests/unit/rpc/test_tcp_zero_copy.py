"""Large records over TCP are not copied in Python: a 1 MiB WRITE's data is written to the file
(``pwritev``) from the very buffer the server's socket received the record into, and our
client's 1 MiB READ replies are decoded in the buffers its socket received them into (the data
then copied once, into the caller's buffer). Our client and server in this process over
loopback TCP, on the standard asyncio loop and on uvloop (``nfsrdma serve`` runs on uvloop when
it is installed; both call ``get_buffer``/``buffer_updated`` of the ``BufferedProtocol``)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

import nfsrdma.client as nc
from nfsrdma.server import NFSServer
from nfsrdma.transport.base import Inbound
from nfsrdma.transport.tcp import TcpConnection
from nfsrdma.transport.tcp_receive import RecordReceiver
from nfsrdma.vfs.openfile import LocalOpenFile
from nfsrdma.xdr.runtime import Buffer

MIB = 1 << 20


def _address(buf: memoryview | bytes | bytearray) -> int | None:
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):
        return None  # read-only memory (bytes): not a receive buffer


async def _transfer(export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = 4 * MIB
    data = os.urandom(size)
    lent: list[tuple[int, int, int]] = []  # (receiver id, start, end) of each lent buffer
    records: list[tuple[int, Buffer]] = []  # (receiver id, record) of each large record
    writes: list[tuple[int | None, int]] = []
    get_buffer = RecordReceiver.get_buffer
    deliver = TcpConnection._deliver
    write = LocalOpenFile.write

    def watched_get_buffer(self: RecordReceiver, sizehint: int = -1) -> memoryview:
        buf = get_buffer(self, sizehint)
        start = _address(buf)
        assert start is not None
        lent.append((id(self), start, start + len(buf)))
        return buf

    def watched_deliver(self: TcpConnection, msg: Inbound) -> None:
        rec = msg.reader.buf
        if len(rec) >= MIB:
            records.append((id(self.rx), rec.obj if isinstance(rec, memoryview) else rec))
        deliver(self, msg)

    def watched_write(
        self: LocalOpenFile, offset: int, buf: bytes | memoryview | bytearray, stable: bool = False
    ) -> int:
        writes.append((_address(buf), len(buf)))
        return write(self, offset, buf, stable)

    monkeypatch.setattr(RecordReceiver, "get_buffer", watched_get_buffer)
    monkeypatch.setattr(TcpConnection, "_deliver", watched_deliver)
    monkeypatch.setattr(LocalOpenFile, "write", watched_write)

    def received_into(rx: int, addr: int | None, n: int) -> bool:
        """[addr, addr + n) lies in memory a receive of ``rx`` was given to fill."""
        return addr is not None and any(c == rx and s <= addr + n and addr < e for c, s, e in lent)

    server = NFSServer(str(export), bind="127.0.0.1", tcp_port=0, root_squash=False)
    await server.start()
    try:
        async with nc.connect(f"nfs://127.0.0.1:{server.tcp_port}/", uid=0, gid=0) as fs:
            assert fs.wsize == fs.rsize == MIB
            async with fs.open("f", "wb") as f:
                await f.write(data)
            assert (export / "f").read_bytes() == data
            sink = bytearray(size)
            async with fs.open("f", "rb") as f:
                assert await f.readinto(sink) == size
            assert sink == data
            server_ids = {id(c.conn.rx) for c in server.connections}
    finally:
        await server.close()
    # Every 1 MiB WRITE went to the file from the memory the server's socket received into ...
    big = [w for w in writes if w[1] == MIB]
    assert len(big) == size // MIB
    (server_id,) = server_ids
    assert all(received_into(server_id, a, n) for a, n in big)
    # ... and every large record either side handled (the WRITE calls, the READ replies) is
    # the buffer it was received into: none was assembled by copying.
    client_records = [r for c, r in records if c != server_id]
    server_records = [r for c, r in records if c == server_id]
    assert len(server_records) == len(client_records) == size // MIB
    for rx, rec in records:
        assert isinstance(rec, bytearray)
        a = _address(rec)
        assert a is not None and received_into(rx, a, len(rec))


async def test_large_records_are_received_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _transfer(tmp_path, monkeypatch)


def test_large_records_are_received_in_place_on_uvloop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uvloop = pytest.importorskip("uvloop")  # a dependency of the "fast" extra
    uvloop.run(_transfer(tmp_path, monkeypatch))
