"""UL-3's property test: for random COMPOUNDs, the bound our client computes for the reply
(``session/client_replysize.py``) is at least the reply each real server sends, our own and
NFS-Ganesha (a third-party server), error arms included. Over TCP, so every reply comes whole
in one record (READ data inline) and its length is exactly what RPC-over-RDMA would have to
provide for."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

import nfsrdma.client as nc
from nfsrdma.client import ops
from nfsrdma.rpc.connection import RpcConnection, RpcResult
from nfsrdma.session.client import SEQUENCE_REPLY
from nfsrdma.session.client_replysize import compound_reply_bound, op_reply_bound
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

from .conftest import Server

# Attributes both servers support (a request for others is answered without them).
ATTRS = (
    nfs4.FATTR4_SUPPORTED_ATTRS, nfs4.FATTR4_TYPE, nfs4.FATTR4_FH_EXPIRE_TYPE,
    nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE, nfs4.FATTR4_LINK_SUPPORT, nfs4.FATTR4_FSID,
    nfs4.FATTR4_LEASE_TIME, nfs4.FATTR4_FILEHANDLE, nfs4.FATTR4_FILEID, nfs4.FATTR4_MAXNAME,
    nfs4.FATTR4_MAXREAD, nfs4.FATTR4_MAXWRITE, nfs4.FATTR4_MODE, nfs4.FATTR4_NUMLINKS,
    nfs4.FATTR4_OWNER, nfs4.FATTR4_OWNER_GROUP, nfs4.FATTR4_RAWDEV, nfs4.FATTR4_SPACE_USED,
    nfs4.FATTR4_TIME_ACCESS, nfs4.FATTR4_TIME_METADATA, nfs4.FATTR4_TIME_MODIFY,
    nfs4.FATTR4_MOUNTED_ON_FILEID, nfs4.FATTR4_SPACE_AVAIL, nfs4.FATTR4_FILES_FREE,
)  # fmt: skip


def random_compound(rng: random.Random, dir_fh: bytes, names: list[bytes]) -> list[Any]:
    body: list[Any] = [ops.putfh(dir_fh)]
    if rng.random() < 0.7:
        body.append(ops.lookup(rng.choice(names)))
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(["getattr", "getattr", "getfh", "access", "readdir", "read", "read",
                           "readlink", "save", "restore"])  # fmt: skip
        if kind == "getattr":
            body.append(ops.getattr_(tuple(rng.sample(ATTRS, rng.randint(1, len(ATTRS))))))
        elif kind == "getfh":
            body.append(ops.getfh())
        elif kind == "access":
            body.append(nfs4.nfs_argop4(nfs4.OP_ACCESS, nfs4.ACCESS4args(0x3F)))
        elif kind == "readdir":
            bits = tuple(rng.sample(ATTRS, rng.randint(0, 8)))
            maxcount = rng.choice([600, 1024, 3000, 8192, 16384])
            body.append(ops.readdir(0, bytes(8), maxcount, maxcount, bits))
        elif kind == "read":
            body.append(ops.read(ops.ANONYMOUS_STATEID, rng.randint(0, 100), rng.randint(0, 9000)))
        elif kind == "readlink":
            body.append(ops.readlink())
        elif kind == "save":
            body.append(ops.savefh())
        else:
            body.append(ops.restorefh())
    return body


def resop_size(r: nfs4.nfs_resop4) -> int:
    w = Writer()
    nfs4.enc_nfs_resop4(w, r)
    return len(w.flatten())  # DDP items spliced back in


@pytest.mark.parametrize("nfs_server", ["ours", "ganesha"], indirect=True)
async def test_ul3_the_bound_covers_every_reply_of_two_servers(
    nfs_server: Server, testdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    call = RpcConnection.call

    async def measured(self: RpcConnection, *a: Any, **k: Any) -> RpcResult:
        result = await call(self, *a, **k)
        sizes.append(len(result.reader.buf))
        return result

    rng = random.Random(8267)
    async with nc.connect(nfs_server.url(), uid=0, gid=0) as fs:
        await fs.mkdir(testdir)
        names = []
        for i in range(40):
            name = f"{i:02d}-" + "n" * rng.randint(1, 200)
            await fs.write_bytes(f"{testdir}/{name}", os.urandom(rng.randint(0, 12000)))
            names.append(name.encode())
        for i in range(12):
            await fs.symlink("t" * rng.randint(100, 4000), f"{testdir}/link{i}")
            names.append(f"link{i}".encode())
        res = await fs.session.compound(
            [ops.putfh(fs.base_fh), ops.lookup(testdir.encode()), ops.getfh()]
        )
        dir_fh = ops.results(res)[-1].object
        monkeypatch.setattr(RpcConnection, "call", measured)
        checked = read_bytes = 0
        ok: dict[int, int] = {}
        for _ in range(150):
            body = random_compound(rng, dir_fh, names)
            bound = compound_reply_bound(body)
            sizes.clear()
            res = await fs.session.compound(body)
            assert len(sizes) == 1
            if bound is None:
                continue
            assert sizes[0] <= bound + SEQUENCE_REPLY, (body, res.status, sizes[0], bound)
            checked += 1
            # Operation by operation, each result against its own bound (the same encoding).
            for op, r in zip(body, res.resarray, strict=False):
                assert r.resop == op.argop
                op_bound = op_reply_bound(op)
                assert op_bound is not None and resop_size(r) <= op_bound, (op, r)
                status = nfs4.OPERATIONS[r.resop].status_of(r.value)
                if status == nfs4.NFS4_OK:
                    ok[r.resop] = ok.get(r.resop, 0) + 1
                    if r.resop == nfs4.OP_READ:
                        read_bytes = max(read_bytes, len(r.value.value.data))
        assert checked >= 100
        # The random COMPOUNDs reached the results that matter, with large values.
        for opnum in (nfs4.OP_GETATTR, nfs4.OP_READ, nfs4.OP_READLINK, nfs4.OP_READDIR):
            assert ok.get(opnum, 0) >= 3, (opnum, ok)
        assert read_bytes > 4000
