"""``--sec``: SECINFO / SECINFO_NO_NAME list the flavours in order, a request with another
flavour gets NFS4ERR_WRONGSEC (RFC 8881 section 2.6.3.1.1), and ``sec="auto"`` picks the
first usable one."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.client.errors import NfsError
from nfsrdma.client.security import server_flavors
from nfsrdma.client.transports import open_connection
from nfsrdma.client.url import parse_url
from nfsrdma.rpc.gss_mech import KRB5_OID_DER
from nfsrdma.session.client import ClientSession
from nfsrdma.session.client_setup import SessionOptions
from nfsrdma.xdr.gen import nfs4
from tests.kdc import Kdc
from tests.unit.gss.helpers import gss_client, gss_server


@pytest.fixture
def ccache(kdc: Kdc, tmp_path: Path) -> Path:
    cc = tmp_path / "ccache"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    return cc


async def test_secinfo_lists_the_flavours_in_order(kdc: Kdc, ccache: Path, tmp_path: Path) -> None:
    sec = ("krb5p", "krb5i", "krb5", "sys")
    async with (
        gss_server(kdc, tmp_path / "e", sec) as server,
        gss_client(server, ccache, "krb5") as fs,
    ):
        assert await server_flavors(fs.session) == ["krb5p", "krb5i", "krb5", "sys"]
        await fs.mkdir("sub")
        res = await fs.session.compound(
            [
                nfs4.nfs_argop4(nfs4.OP_PUTROOTFH, None),
                nfs4.nfs_argop4(nfs4.OP_SECINFO, nfs4.SECINFO4args(b"sub")),
            ]
        )
        entries = res.resarray[-1].value.value
        assert [e.flavor for e in entries] == [6, 6, 6, 1]
        assert [e.value.service for e in entries[:3]] == [3, 2, 1]
        assert all(bytes(e.value.oid) == KRB5_OID_DER and e.value.qop == 0 for e in entries[:3])


async def test_another_flavour_gets_wrongsec(kdc: Kdc, ccache: Path, tmp_path: Path) -> None:
    async with gss_server(kdc, tmp_path / "e", ("krb5i",)) as server:
        # AUTH_SYS may still ask (PUTROOTFH + SECINFO_NO_NAME) but not use the export.
        target = parse_url(f"nfs://127.0.0.1:{server.tcp_port}/")
        session = ClientSession(lambda: open_connection(target), SessionOptions(uid=0, gid=0))
        await session.start()
        try:
            assert await server_flavors(session) == ["krb5i"]
            for ops in (
                [nfs4.nfs_argop4(nfs4.OP_PUTROOTFH, None), nfs4.nfs_argop4(nfs4.OP_GETFH, None)],
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTROOTFH, None),
                    nfs4.nfs_argop4(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"x")),
                ],
            ):
                res = await session.compound(ops)
                assert res.status == nfs4.NFS4ERR_WRONGSEC
                # Refused at PUTROOTFH before GETFH, at LOOKUP after PUTROOTFH.
                assert res.resarray[-1].resop == ops[len(res.resarray) - 1].argop
                assert len(res.resarray) == (1 if ops[1].argop == nfs4.OP_GETFH else 2)
        finally:
            await session.close()
        for sec in ("sys", "krb5"):  # krb5 is not krb5i
            with pytest.raises(NfsError) as e:
                async with gss_client(server, ccache, sec):
                    pass
            assert e.value.status == nfs4.NFS4ERR_WRONGSEC
        async with gss_client(server, ccache, "auto") as fs:
            assert fs.session.gss is not None and fs.session.gss.service == 2
            await fs.write_bytes("f", b"chosen")
            assert await fs.read_bytes("f") == b"chosen"
