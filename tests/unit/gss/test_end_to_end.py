"""Our client ↔ our server with RPCSEC_GSS (krb5, krb5i, krb5p) against a real MIT KDC:
over TCP loopback, and over RPC-over-RDMA on the in-process verbs provider."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import parse_url
from nfsrdma.server import NFSServer
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import connect_rdma
from nfsrdma.transport.rdma.inproc import InprocFabric
from nfsrdma.xdr.gen import nfs4
from tests.kdc import SERVER_HOST, Kdc
from tests.unit.gss.helpers import content, gss_client, gss_server, owner, release

SERVICES = ("krb5", "krb5i", "krb5p")


@pytest.fixture
def ccache(kdc: Kdc, tmp_path: Path) -> Path:
    """A ticket for the principal "4242" (uid 4242 by the numeric fallback)."""
    cc = tmp_path / "ccache"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    return cc


@pytest.mark.parametrize("sec", SERVICES)
async def test_each_service_over_tcp(kdc: Kdc, ccache: Path, tmp_path: Path, sec: str) -> None:
    export = tmp_path / "export"
    data = os.urandom(300_000)
    async with gss_server(kdc, export) as server, gss_client(server, ccache, sec) as fs:
        await fs.mkdir("d")
        await fs.write_bytes("d/f", data)
        assert await fs.read_bytes("d/f") == data
        assert [e.name async for e in fs.scandir("d")] == ["f"]
        # The principal's identity applied to the file system: uid 4242 made them.
        assert owner(export / "d" / "f") == 4242
        assert owner(export / "d") == 4242
        assert fs.session.gss is not None and fs.session.gss.contexts_made == 1
        assert server.gss is not None and len(server.gss.contexts.by_principal()) == 1


async def test_a_user_the_name_service_does_not_know_is_anonymous(kdc: Kdc, tmp_path: Path) -> None:
    cc = tmp_path / "alice"
    kdc.kinit(cc)  # alice@REALM: no local user "alice"
    export = tmp_path / "export"
    async with gss_server(kdc, export) as server, gss_client(server, cc, "krb5i") as fs:
        await fs.write_bytes("a", b"hello")
    assert owner(export / "a") == 65534


async def _rdma_session(
    server: NFSServer, fabric: InprocFabric, ccache: Path, sec: str
) -> tuple[ClientSession, NfsClient]:
    cdev = fabric.device("10.9.0.2")

    async def connect() -> Connection:
        return await connect_rdma(cdev, "10.9.0.1", 20049)

    opts = SessionOptions(
        uid=0, gid=0, sec=sec, gss_host=SERVER_HOST, ccache=f"FILE:{ccache}",
        rsize=128 << 10, wsize=128 << 10,
    )  # fmt: skip
    session = ClientSession(connect, opts)
    await session.start()
    client = NfsClient(session, parse_url("rdma://10.9.0.1/"))
    await client.mount()
    return session, client


@pytest.mark.parametrize("sec", SERVICES)
async def test_each_service_over_rdma(kdc: Kdc, ccache: Path, tmp_path: Path, sec: str) -> None:
    fabric = InprocFabric()
    export = tmp_path / "export"
    size = 1 << 20
    data = os.urandom(size)
    async with gss_server(
        kdc, export, rdma_port=20049, rdma_device=fabric.device("10.9.0.1")
    ) as server:
        session, fs = await _rdma_session(server, fabric, ccache, sec)
        try:
            async with fs.open("f", "wb") as f:
                await f.write(data)
            assert content(export / "f") == data
            buf = bytearray(size)
            async with fs.open("f", "rb") as f:
                assert await f.readinto(buf) == size
            assert hashlib.sha256(buf).digest() == hashlib.sha256(data).digest()
            if sec == "krb5":
                # Authentication only: READ data still moves by RDMA Write into our buffer.
                assert fs.io_stats.placed_reads == size // (128 << 10)
            else:
                # Integrity and privacy protect the whole body (RFC 8166 section 9.2): no
                # Write chunk; the data was verified / decrypted before it reached ``buf``.
                assert fs.io_stats.placed_reads == 0
                assert fs.io_stats.copied_reads == size // (128 << 10)
            assert owner(export / "f") == 4242
        finally:
            await fs.aclose()
            await session.close()
            release(server)


@pytest.mark.parametrize("sec", SERVICES)
async def test_a_retransmission_is_answered_from_the_reply_cache_under_its_own_sequence_number(
    kdc: Kdc, ccache: Path, tmp_path: Path, sec: str
) -> None:
    """The same SEQUENCE (slot, seqid) sent twice, each time as a new RPCSEC_GSS call: the
    second is answered from the session's reply cache, sealed for its own sequence number (our
    client checks the verifier and, under krb5i/krb5p, the protected body's number)."""
    export = tmp_path / "export"
    async with gss_server(kdc, export) as server, gss_client(server, ccache, sec) as fs:
        session = fs.session
        assert session.rpc is not None and session.gss is not None
        slot = session.slots.acquire()
        assert slot is not None
        ops = [
            nfs4.nfs_argop4(
                nfs4.OP_SEQUENCE,
                nfs4.SEQUENCE4args(session.negotiated.sessionid, slot.seqid, slot.slotid, 0, True),
            ),
            nfs4.nfs_argop4(nfs4.OP_PUTROOTFH, None),
            nfs4.nfs_argop4(
                nfs4.OP_CREATE,
                nfs4.CREATE4args(nfs4.createtype4(nfs4.NF4DIR), b"once", nfs4.fattr4([], b"")),
            ),
        ]
        first = await session._call(session.rpc, ops, None)
        again = await session._call(session.rpc, ops, None)
        session.slots.completed(slot)
        session.slots.release(slot)
        assert first.status == again.status == nfs4.NFS4_OK  # not NFS4ERR_EXIST: a replay
        assert first.resarray[2] == again.resarray[2]
        assert [e.name async for e in fs.scandir("/")] == ["once"]
