"""SP4_MACH_CRED (RFC 8881 sections 2.10.8.3, 18.35): once a client's EXCHANGE_ID came with
RPCSEC_GSS, only its principal may create, rebind or destroy its sessions and record."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.session.client_core import NfsStatusError
from nfsrdma.session.client_setup import bind_conn_args, exchange_id_args
from nfsrdma.transport.tcp import connect_tcp
from nfsrdma.xdr.gen import nfs4
from tests.kdc import Kdc
from tests.unit.gss.helpers import gss_client, gss_server


async def test_only_the_machine_principal_may_touch_the_clients_state(
    kdc: Kdc, tmp_path: Path
) -> None:
    owner_cc, other_cc = tmp_path / "owner", tmp_path / "other"
    kdc.kinit(owner_cc, kdc.numeric_principal, kdc.numeric_keytab)
    kdc.kinit(other_cc)
    async with (
        gss_server(kdc, tmp_path / "e") as server,
        gss_client(server, owner_cc, "krb5i") as owner,
        gss_client(server, other_cc, "krb5i") as other,
    ):
        assert owner.session.state_protection == nfs4.SP4_MACH_CRED
        assert other.session.state_protection == nfs4.SP4_MACH_CRED
        sid = owner.session.negotiated.sessionid
        clientid = owner.session.clientid
        rpc = other.session.rpc
        assert rpc is not None and clientid is not None
        for op, args in (
            (nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(sid)),
            (nfs4.OP_BIND_CONN_TO_SESSION, bind_conn_args(sid, False)),
            (nfs4.OP_DESTROY_CLIENTID, nfs4.DESTROY_CLIENTID4args(clientid)),
        ):
            with pytest.raises(NfsStatusError) as e:
                await other.session._sessionless(rpc, op, args)
            assert e.value.status == nfs4.NFS4ERR_ACCESS, op
        # The owner's session is intact and still serves it.
        await owner.write_bytes("mine", b"still here")
        assert await owner.read_bytes("mine") == b"still here"


async def test_a_new_connection_is_bound_explicitly(kdc: Kdc, tmp_path: Path) -> None:
    cc = tmp_path / "cc"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    async with gss_server(kdc, tmp_path / "e") as server, gss_client(server, cc, "krb5p") as fs:
        await fs.write_bytes("a", b"1")
        rpc = fs.session.rpc
        assert rpc is not None
        # A SEQUENCE on a connection never bound is refused (18.46.3) ...
        session = fs.session
        other = RpcConnection(await connect_tcp("127.0.0.1", server.tcp_port))
        slot = session.slots.acquire()
        assert slot is not None
        seq = nfs4.SEQUENCE4args(session.negotiated.sessionid, slot.seqid, slot.slotid, 0, False)
        res = await session._call(other, [nfs4.nfs_argop4(nfs4.OP_SEQUENCE, seq)], None)
        session.slots.release(slot)
        other.close()
        assert res.status == nfs4.NFS4ERR_CONN_NOT_BOUND_TO_SESSION
        # ... so our client binds a new connection before it resends.
        binds = fs.session.stats.binds
        rpc.conn.abort()
        await rpc.closed.wait()
        assert await fs.read_bytes("a") == b"1"  # reconnected, bound, resent
        assert fs.session.stats.binds == binds + 1


async def test_sys_and_krb5_clients_keep_sp4_none(kdc: Kdc, tmp_path: Path) -> None:
    """SP4_MACH_CRED needs integrity or privacy (18.35.3): krb5 and sys clients use SP4_NONE,
    and a server refuses SP4_MACH_CRED under krb5 (NFS4ERR_INVAL, as knfsd does)."""
    cc = tmp_path / "cc"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    async with gss_server(kdc, tmp_path / "e") as server:
        async with gss_client(server, None, "sys") as fs:
            assert fs.session.state_protection == nfs4.SP4_NONE
            await fs.write_bytes("a", b"1")
        async with gss_client(server, cc, "krb5") as fs:
            assert fs.session.state_protection == nfs4.SP4_NONE
            rpc = fs.session.rpc
            assert rpc is not None
            args = exchange_id_args(b"another-owner", b"12345678", mach_cred=True)
            with pytest.raises(NfsStatusError) as e:
                await fs.session._sessionless(rpc, nfs4.OP_EXCHANGE_ID, args)
            assert e.value.status == nfs4.NFS4ERR_INVAL


async def test_client_falls_back_to_sp4_none_when_mach_cred_is_refused(
    kdc: Kdc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """knfsd with rpc.svcgssd (no principal name passed to the kernel) answers an SP4_MACH_CRED
    EXCHANGE_ID with NFS4ERR_SERVERFAULT: our client then asks for SP4_NONE. The server here
    answers as that knfsd does (its EXCHANGE_ID handler replaced in the handler table: the
    compiled build calls ServerSessions' methods directly, past any patch of the class)."""
    from nfsrdma.nfs4.context import CompoundContext, Nfs4Error, bind
    from nfsrdma.nfs4.ops import HANDLERS

    real = HANDLERS[nfs4.OP_EXCHANGE_ID].handler

    def like_knfsd_with_svcgssd(
        ctx: CompoundContext, args: nfs4.EXCHANGE_ID4args
    ) -> nfs4.EXCHANGE_ID4res:
        if args.eia_state_protect.spa_how == nfs4.SP4_MACH_CRED:
            raise Nfs4Error(nfs4.NFS4ERR_SERVERFAULT)
        result = real(ctx, args)
        assert isinstance(result, nfs4.EXCHANGE_ID4res)
        return result

    monkeypatch.setitem(
        HANDLERS, nfs4.OP_EXCHANGE_ID, bind(nfs4.OPERATION_EXCHANGE_ID, like_knfsd_with_svcgssd)
    )
    cc = tmp_path / "cc"
    kdc.kinit(cc, kdc.numeric_principal, kdc.numeric_keytab)
    async with gss_server(kdc, tmp_path / "e") as server, gss_client(server, cc, "krb5i") as fs:
        assert fs.session.state_protection == nfs4.SP4_NONE
        await fs.write_bytes("a", b"1")
        assert await fs.read_bytes("a") == b"1"
