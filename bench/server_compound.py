"""Server CPU per COMPOUND, in process: the NFSv4.1 server's COMPOUND processing (decode, run,
encode) with no transport, on the real local VFS over a temporary directory.

Three COMPOUNDs the Linux client sends most, each on a fresh slot sequence so every one runs
(no reply-cache hit):
1. SEQUENCE + PUTFH + GETATTR (the 15 attributes of nfs4_fattr_bitmap);
2. SEQUENCE + PUTFH + READ of 4 KiB (served inline, below the thread-pool threshold);
3. SEQUENCE + PUTFH + SETATTR(mode) + GETATTR.
Last line: ``getattr_us=… read_us=… setattr_us=…`` (microseconds of CPU per COMPOUND, best
of ``--repeat`` runs; lower is better).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attr_encode import linux_getattr_bitmap

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.compound import compound
from nfsrdma.nfs4.server_state import ServerConfig, ServerState
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys, credential_of
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.server import RpcCall
from nfsrdma.session.server import ServerSessions
from nfsrdma.transport.base import Connection, Inbound, ReplyExpectation
from nfsrdma.vfs import Export, LocalVfs
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Reader, Writer

CRED = auth_sys(0, 0, (), "bench-host")
OK = nfs4.NFS4_OK
LINUX_BITMAP = linux_getattr_bitmap()


class _Nowhere(Connection):
    kind = "mem"

    def send_call(self, xid: int, msg: Writer, expect: ReplyExpectation | None) -> None:
        raise ConnectionError("no peer")

    def send_reply(self, request: Inbound, msg: Writer) -> None:
        pass

    def close(self) -> None:
        self._closed(None)


def _op(num: int, args: object = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


class Bench:
    def __init__(
        self,
        root: Path,
        *,
        watch_moves: bool = True,
        cred: rpc.opaque_auth = CRED,
        root_squash: bool = False,
    ) -> None:
        export = root / "export"
        export.mkdir()
        self.cred = cred  # the AUTH_SYS credential every request carries
        self.vfs = LocalVfs(
            Export(root=str(export), state_dir=str(root / "state"), root_squash=root_squash),
            watch_moves=watch_moves,
        )
        cfg = ServerConfig()
        sessions = ServerSessions.from_config(cfg, on_client_expired=lambda _c: None)
        self.server = ServerState(cfg, self.vfs, sessions, StateManager(self.vfs))
        self.conn = RpcConnection(_Nowhere("bench"))
        self.xid = 0
        self.seqid = 0
        self.sessionid = b""

    def request(self, ops: list[nfs4.nfs_argop4]) -> bytes:
        self.xid += 1
        w = Writer()
        message.encode_call(w, self.xid, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, self.cred)
        nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, ops))
        return bytes(w.flatten())

    async def run(self, data: bytes) -> Writer:
        reader = Reader(data)
        xid, body, off = message.decode_call(reader)
        call = RpcCall(
            xid,
            body.prog,
            body.vers,
            body.proc,
            credential_of(body.cred, body.verf),
            reader,
            off,
            self.conn,
            Inbound(reader),
        )
        out = Writer()
        pending = compound(self.server, call, out)
        if pending is not None:
            await pending
        return out

    async def result(self, ops: list[nfs4.nfs_argop4]) -> nfs4.COMPOUND4res:
        out = await self.run(self.request(ops))
        res, _ = nfs4.dec_COMPOUND4res(Reader(out.flatten()), 0)
        assert res.status == OK, nfs4.nfsstat4(res.status).name
        return res

    async def mount(self) -> bytes:
        owner = nfs4.client_owner4(b"boot0001", b"bench client")
        eia = nfs4.EXCHANGE_ID4args(owner, 0, nfs4.state_protect4_a(nfs4.SP4_NONE), [])
        eir = (await self.result([_op(nfs4.OP_EXCHANGE_ID, eia)])).resarray[0].value.value
        fore = nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 64, [])
        back = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])
        csa = nfs4.CREATE_SESSION4args(
            eir.eir_clientid, eir.eir_sequenceid, 0, fore, back, 0x40000000, []
        )
        csr = (await self.result([_op(nfs4.OP_CREATE_SESSION, csa)])).resarray[0].value.value
        self.sessionid = csr.csr_sessionid
        await self.result(
            [self.sequence(), _op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False))]
        )
        root = await self.result([self.sequence(), _op(nfs4.OP_PUTROOTFH), _op(nfs4.OP_GETFH)])
        fh: bytes = root.resarray[2].value.value.object
        return fh

    def sequence(self) -> nfs4.nfs_argop4:
        self.seqid += 1
        return _op(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(self.sessionid, self.seqid, 0, 0, False))


async def time_compounds(bench: Bench, make: Callable[[], list[nfs4.nfs_argop4]], n: int) -> float:
    """Microseconds of process CPU per COMPOUND (requests are encoded beforehand)."""
    requests = [bench.request(make()) for _ in range(n)]
    t0 = time.process_time_ns()
    for data in requests:
        await bench.run(data)
    return (time.process_time_ns() - t0) / n / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=20000, help="COMPOUNDs per measure")
    ap.add_argument("--repeat", type=int, default=5, help="measures; the best is kept")
    return asyncio.run(measure(ap.parse_args()))


async def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        try:
            root_fh = await bench.mount()
            name = b"file"
            how = nfs4.createhow4(nfs4.UNCHECKED4, nfs4.fattr4(bitmap_of([]), b""))
            created = await bench.result(
                [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(root_fh)),
                    _op(
                        nfs4.OP_OPEN,
                        nfs4.OPEN4args(
                            0,
                            nfs4.OPEN4_SHARE_ACCESS_BOTH,
                            nfs4.OPEN4_SHARE_DENY_NONE,
                            nfs4.open_owner4(1, b"bench"),
                            nfs4.openflag4(nfs4.OPEN4_CREATE, how),
                            nfs4.open_claim4(nfs4.CLAIM_NULL, name),
                        ),
                    ),
                    _op(nfs4.OP_GETFH),
                ]
            )
            fh: bytes = created.resarray[3].value.value.object
            stateid = created.resarray[2].value.value.stateid
            await bench.result(
                [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(
                        nfs4.OP_WRITE,
                        nfs4.WRITE4args(stateid, 0, nfs4.FILE_SYNC4, bytes(range(256)) * 16),
                    ),
                ]
            )
            mode = nfs4.fattr4(bitmap_of([nfs4.FATTR4_MODE]), (0o644).to_bytes(4, "big"))

            def getattr_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
                ]

            def read_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_READ, nfs4.READ4args(stateid, 0, 4096)),
                ]

            def setattr_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_SETATTR, nfs4.SETATTR4args(stateid, mode)),
                    _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
                ]

            for make in (getattr_ops, read_ops, setattr_ops):  # each must succeed
                await bench.result(make())
            figures = {}
            for key, make in (
                ("getattr_us", getattr_ops),
                ("read_us", read_ops),
                ("setattr_us", setattr_ops),
            ):
                figures[key] = min(
                    [await time_compounds(bench, make, args.count) for _ in range(args.repeat)]
                )
                print(f"{key[:-3]:>8}: {figures[key]:7.2f} us CPU per COMPOUND", flush=True)
        finally:
            bench.server.close()
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
