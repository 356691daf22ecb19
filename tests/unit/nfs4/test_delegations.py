"""Delegations end to end (RFC 8881 sections 10.2, 10.4, 18.16, 18.6, 18.38, 18.48, 20.2):
our ClientSession(s) with real back channels against a real NFSServer over TCP on 127.0.0.1.

The holder answers CB_RECALL with DELEGRETURN by itself (``session/client_callbacks.py``);
tests wait on events (the holder's DELEGRETURN done, the server's recall sent), never on time.
The revocation clock is the server's sans-IO table driven with an explicit ``now``."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4.delegation_service import DelegationService
from nfsrdma.nfs4.delegations import Delegation
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.server import NFSServer
from nfsrdma.vfs.leases import F_GETLEASE, Lease
from nfsrdma.xdr.gen import nfs4

from .test_io_ops import (
    LARGE_IO,
    NOCREATE,
    OK,
    Nfs,
    mode_attrs,
    op,
    open_op,
    served,
)

READ = nfs4.OPEN4_SHARE_ACCESS_READ
WRITE = nfs4.OPEN4_SHARE_ACCESS_WRITE
BOTH = nfs4.OPEN4_SHARE_ACCESS_BOTH
WANT_READ = nfs4.OPEN4_SHARE_ACCESS_WANT_READ_DELEG
WANT_WRITE = nfs4.OPEN4_SHARE_ACCESS_WANT_WRITE_DELEG
WANT_ANY = nfs4.OPEN4_SHARE_ACCESS_WANT_ANY_DELEG
WANT_NONE = nfs4.OPEN4_SHARE_ACCESS_WANT_NO_DELEG
REVOKED_FLAG = nfs4.SEQ4_STATUS_RECALLABLE_STATE_REVOKED


def service(server: NFSServer) -> DelegationService:
    assert server.state is not None and server.state.delegation_service is not None
    return server.state.delegation_service


class Returns:
    """Counts the holder's DELEGRETURNs (done, i.e. answered) and lets a test wait for one."""

    def __init__(self, c: Nfs, *, refuse: bool = False) -> None:
        self.done = 0
        self.event = asyncio.Event()
        cb = c.s.callbacks
        original = cb.return_delegation

        async def returning(stateid: nfs4.stateid4, fh: bytes) -> None:
            if not refuse:
                await original(stateid, fh)
            self.done += 1
            self.event.set()

        cb.return_delegation = returning  # type: ignore[method-assign]

    async def wait(self) -> None:
        await self.event.wait()
        self.event.clear()


class Recalls:
    """The server's CB_RECALLs as they are sent."""

    def __init__(self, server: NFSServer) -> None:
        table = service(server).table
        self.sent: list[Delegation] = []
        self.event = asyncio.Event()
        original = table.recall
        assert original is not None

        def recall(d: Delegation) -> None:
            self.sent.append(d)
            self.event.set()
            original(d)

        table.recall = recall


def flags_seen(c: Nfs) -> list[int]:
    """sr_status_flags of every SEQUENCE reply the client gets from now on."""
    seen: list[int] = []
    original = c.s._call

    async def record(*args: Any, **kw: Any) -> nfs4.COMPOUND4res:
        res = await original(*args, **kw)
        first = res.resarray[0].value if res.resarray else None
        if isinstance(first, nfs4.SEQUENCE4res) and first.value is not None:
            seen.append(first.value.sr_status_flags)
        return res

    c.s._call = record  # type: ignore[method-assign]
    return seen


@contextlib.asynccontextmanager
async def deleg_served(
    tmp_path: Path, clients: int = 2, config: ServerConfig | None = None
) -> AsyncIterator[tuple[NFSServer, list[Nfs]]]:
    """Clients with back channels, each probed (CB_NULL answered) before the test starts."""
    async with served(tmp_path, clients, config, backchannel=True) as (server, cs):
        for c in cs:
            assert await service(server).probe(c.clientid)
        yield server, cs


def deleg_of(ok: nfs4.OPEN4resok) -> Any:
    return ok.delegation.value


async def make_file(c: Nfs, name: bytes, data: bytes = b"content") -> bytes:
    fh, sid, _ = await c.open(name, BOTH | WANT_NONE)
    await c.write(fh, sid, 0, data)
    await c.close(fh, sid)
    return fh


# ---------------------------------------------------------------- grant


async def test_read_delegation_is_granted_once_the_back_channel_answered(tmp_path: Path) -> None:
    async with served(tmp_path, clients=1, backchannel=True) as (server, (a,)):
        await make_file(a, b"f")
        # CREATE_SESSION started the CB_NULL probe; once answered, OPEN delegates.
        assert await service(server).probe(a.clientid)
        fh, s2, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE, owner=b"o2")
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_READ
        d = deleg_of(ok).stateid
        assert d.seqid == 1 and d.other != s2.other
        # No preference: the same delegation again.
        _, _, ok = await a.open(b"f", READ, how=NOCREATE, owner=b"o3")
        assert deleg_of(ok).stateid == d
        # I/O with the delegation stateid reads through the client's open.
        assert await a.read(fh, d, 0, 100) == (b"content", True)
        await a.on(
            fh,
            nfs4.NFS4ERR_OPENMODE,
            op(nfs4.OP_WRITE, nfs4.WRITE4args(d, 0, nfs4.UNSTABLE4, b"x")),
        )
        await a.on(fh, OK, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))


async def test_no_delegation_while_the_back_channel_does_not_answer(tmp_path: Path) -> None:
    """A callback program the client does not serve: CB_NULL fails, the path is reported
    down, OPEN says WND4_RESOURCE; back to the right program, delegations come back."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"f")
        program = a.s.opts.cb_program
        sec = [nfs4.callback_sec_parms4(nfs4.AUTH_NONE)]
        seen = flags_seen(a)
        await a.expect(OK, op(nfs4.OP_BACKCHANNEL_CTL, nfs4.BACKCHANNEL_CTL4args(program + 1, sec)))
        assert not await service(server).probe(a.clientid)
        _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE)
        assert deleg_of(ok).ond_why == nfs4.WND4_RESOURCE
        assert seen[-1] & nfs4.SEQ4_STATUS_CB_PATH_DOWN_SESSION
        await a.expect(OK, op(nfs4.OP_BACKCHANNEL_CTL, nfs4.BACKCHANNEL_CTL4args(program, sec)))
        assert await service(server).probe(a.clientid)
        _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE, owner=b"o2")
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_READ


async def test_write_delegation_for_an_exclusive_writer(tmp_path: Path) -> None:
    async with deleg_served(tmp_path) as (_server, (a, b)):
        fh, _, ok = await a.open(b"w", BOTH | WANT_ANY)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        d = deleg_of(ok).stateid
        await a.write(fh, d, 0, b"written under a delegation")
        # SETATTR of size with the delegation stateid is the holder's own business.
        await a.on(fh, OK, op(nfs4.OP_SETATTR, nfs4.SETATTR4args(d, mode_attrs(size=7))))
        # Another client that already has the file open means contention for a new writer.
        await make_file(b, b"shared")
        _, _sb, _ = await b.open(b"shared", READ, how=NOCREATE)
        _, _, ok = await a.open(b"shared", BOTH | WANT_WRITE, how=NOCREATE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
        assert deleg_of(ok).ond_why == nfs4.WND4_CONTENTION


async def test_an_open_that_creates_the_file_is_delegated_only_when_asked(tmp_path: Path) -> None:
    """A create with no preference (the Linux client's OPEN) gets no delegation: it would cost a
    kernel lease and a DELEGRETURN for a file that is mostly written, closed and removed next.
    Asked for explicitly, or on an OPEN of the existing file (also UNCHECKED4 create of one that
    exists), it is delegated as before."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        fh, sid, ok = await a.open(b"new", BOTH)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE
        assert service(server).table.held(a.clientid, fh) is None
        await a.close(fh, sid)
        _, _, ok = await a.open(b"new", BOTH)  # UNCHECKED4 of the existing file: no create
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        _, _, ok = await a.open(b"asked", BOTH | WANT_WRITE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE


async def test_wants_and_contention_say_why_not(tmp_path: Path) -> None:
    async with deleg_served(tmp_path) as (_server, (a, b)):
        await make_file(a, b"f")
        _, _, ok = await a.open(b"f", READ | WANT_NONE, how=NOCREATE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
        assert deleg_of(ok).ond_why == nfs4.WND4_NOT_WANTED
        _, _, ok = await a.open(b"f", READ | nfs4.OPEN4_SHARE_ACCESS_WANT_CANCEL, how=NOCREATE)
        assert deleg_of(ok).ond_why == nfs4.WND4_CANCELLED
        # A writer from another client: no read delegation (contention).
        await b.open(b"f", WRITE | WANT_NONE, how=NOCREATE)
        _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE, owner=b"o2")
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
        assert deleg_of(ok).ond_why == nfs4.WND4_CONTENTION
        # Without a want: plain OPEN_DELEGATE_NONE.
        _, _, ok = await a.open(b"f", READ, how=NOCREATE, owner=b"o3")
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE


async def test_no_delegations_option(tmp_path: Path) -> None:
    config = ServerConfig(large_io=LARGE_IO, delegations=False)
    async with served(tmp_path, 1, config, backchannel=True) as (server, (a,)):
        await make_file(a, b"f")
        for _ in range(2):  # probed or not, none is granted
            _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE)
            assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
            assert deleg_of(ok).ond_why == nfs4.WND4_RESOURCE
        assert service(server).table.granted == 0


def test_serve_no_delegations_flag() -> None:
    from nfsrdma.cli import build_parser

    args = build_parser().parse_args(["serve", "/tmp", "--no-delegations"])
    assert args.delegations is False
    assert build_parser().parse_args(["serve", "/tmp"]).delegations is True


async def test_callback_security_decides_whether_callbacks_happen(tmp_path: Path) -> None:
    """csa_sec_parms / BACKCHANNEL_CTL: an empty list means no callbacks (no delegations,
    SEQ4_STATUS_CB_PATH_DOWN); AUTH_SYS or AUTH_NONE brings them back."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"f")
        program = a.s.opts.cb_program
        seen = flags_seen(a)
        await a.expect(OK, op(nfs4.OP_BACKCHANNEL_CTL, nfs4.BACKCHANNEL_CTL4args(program, [])))
        await a.expect(OK, op(nfs4.OP_PUTROOTFH))
        assert seen[-1] & nfs4.SEQ4_STATUS_CB_PATH_DOWN
        _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE)
        assert deleg_of(ok).ond_why == nfs4.WND4_RESOURCE
        assert not await service(server).probe(a.clientid)
        sys_parms = nfs4.callback_sec_parms4(
            nfs4.AUTH_SYS, nfs4.authsys_parms(0, "client", os.getuid(), os.getgid(), [])
        )
        await a.expect(
            OK, op(nfs4.OP_BACKCHANNEL_CTL, nfs4.BACKCHANNEL_CTL4args(program, [sys_parms]))
        )
        await a.expect(OK, op(nfs4.OP_PUTROOTFH))
        assert not seen[-1] & nfs4.SEQ4_STATUS_CB_PATH_DOWN
        assert await service(server).probe(a.clientid)
        _, _, ok = await a.open(b"f", READ | WANT_READ, how=NOCREATE, owner=b"o2")
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_READ


# ---------------------------------------------------------------- recall


async def _holding_read(a: Nfs, name: bytes = b"f") -> tuple[bytes, nfs4.stateid4]:
    await make_file(a, name)
    fh, _, ok = await a.open(name, READ | WANT_READ, how=NOCREATE)
    assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_READ
    return fh, deleg_of(ok).stateid


async def test_conflicting_open_is_delayed_until_the_holder_returns(tmp_path: Path) -> None:
    async with deleg_served(tmp_path) as (server, (a, b)):
        fh, d = await _holding_read(a)
        returns = Returns(a)
        recalls = Recalls(server)
        # A reader from another client does not conflict with a read delegation.
        _, _, _ok = await b.open(b"f", READ | WANT_NONE, how=NOCREATE)
        assert recalls.sent == [] and b.s.stats.delays == 0
        # A writer does: NFS4ERR_DELAY (the client retries by itself) while CB_RECALL goes.
        opening = asyncio.ensure_future(b.open(b"f", WRITE, how=NOCREATE, owner=b"w"))
        await returns.wait()
        await opening
        assert b.s.stats.delays >= 1
        assert [r.other for r in recalls.sent] == [d.other]
        assert a.s.stats.recalls == 1
        await a.on(fh, nfs4.NFS4ERR_BAD_STATEID, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))


async def test_a_courteous_holders_delegation_gives_way_at_once(tmp_path: Path) -> None:
    """Courteous expiry (issue 11 section 3, as knfsd): the holder's lease has run out, so a
    conflicting OPEN is neither delayed nor made to wait for a recall: the holder is expired,
    its delegation with it, and the OPEN succeeds in the same COMPOUND."""
    async with deleg_served(tmp_path) as (server, (a, b)):
        await _holding_read(a)
        recalls = Recalls(server)
        assert server.state is not None
        sessions = server.state.sessions
        record = sessions.clients.get(a.clientid)
        assert record is not None
        record.last_renewed -= 10 * sessions.lease_time  # A has been silent for ten leases
        assert sessions.courteous(a.clientid)
        await b.open(b"f", WRITE, how=NOCREATE, owner=b"w")
        assert b.s.stats.delays == 0 and recalls.sent == []
        assert sessions.clients.get(a.clientid) is None
        assert not server.state.state_manager.client_has_state(a.clientid)


@pytest.mark.parametrize("operation", ["remove", "rename", "rename_over", "link", "size", "mode"])
async def test_namespace_and_setattr_changes_recall(tmp_path: Path, operation: str) -> None:
    async with deleg_served(tmp_path) as (server, (a, b)):
        fh, _d = await _holding_read(a)
        returns = Returns(a)
        root = op(nfs4.OP_PUTROOTFH)
        save = op(nfs4.OP_SAVEFH)
        ops: dict[str, list[nfs4.nfs_argop4]] = {
            "remove": [root, op(nfs4.OP_REMOVE, nfs4.REMOVE4args(b"f"))],
            "rename": [root, save, op(nfs4.OP_RENAME, nfs4.RENAME4args(b"f", b"g"))],
            "link": [
                op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                save,
                root,
                op(nfs4.OP_LINK, nfs4.LINK4args(b"h")),
            ],
            "size": [
                op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                op(
                    nfs4.OP_SETATTR,
                    nfs4.SETATTR4args(nfs4.stateid4(0, bytes(12)), mode_attrs(size=0)),
                ),
            ],
            "mode": [
                op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                op(nfs4.OP_SETATTR, nfs4.SETATTR4args(nfs4.stateid4(0, bytes(12)), mode_attrs())),
            ],
        }
        if operation == "rename_over":
            await make_file(b, b"src")
            ops[operation] = [root, save, op(nfs4.OP_RENAME, nfs4.RENAME4args(b"src", b"f"))]
        changing = asyncio.ensure_future(b.expect(OK, *ops[operation]))
        await returns.wait()
        await changing
        assert b.s.stats.delays >= 1 and a.s.stats.recalls == 1
        assert service(server).table.held(a.clientid, fh) is None


async def test_the_holders_own_changes_do_not_recall(tmp_path: Path) -> None:
    async with deleg_served(tmp_path) as (server, (a, _b)):
        fh, _ = await _holding_read(a)
        recalls = Recalls(server)
        await a.on(
            fh,
            OK,
            op(nfs4.OP_SETATTR, nfs4.SETATTR4args(nfs4.stateid4(0, bytes(12)), mode_attrs(0o600))),
        )
        # Only the holder's delegation stands: REMOVE's delegation check looks nothing up
        assert server.state is not None
        vfs = server.state.vfs
        looked_up: list[bytes] = []
        real_lookup = vfs.lookup

        def lookup(cred: Any, dir_fh: bytes, name: bytes | str) -> bytes:
            looked_up.append(bytes(name) if isinstance(name, bytes) else name.encode())
            return real_lookup(cred, dir_fh, name)

        vfs.lookup = lookup  # type: ignore[method-assign]
        try:
            await a.expect(OK, op(nfs4.OP_PUTROOTFH), op(nfs4.OP_REMOVE, nfs4.REMOVE4args(b"f")))
        finally:
            del vfs.lookup
        assert looked_up == []
        assert recalls.sent == [] and a.s.stats.recalls == 0


# ---------------------------------------------------------------- revocation


async def test_a_delegation_not_returned_is_revoked_after_the_lease(tmp_path: Path) -> None:
    async with deleg_served(tmp_path) as (server, (a, b)):
        fh, d = await _holding_read(a)
        Returns(a, refuse=True)  # the holder ignores the recall
        recalls = Recalls(server)
        seen = flags_seen(a)
        svc = service(server)
        opening = asyncio.ensure_future(b.open(b"f", WRITE, how=NOCREATE, owner=b"w"))
        await recalls.event.wait()
        recalled_at = recalls.sent[0].recalled
        assert recalled_at is not None
        assert svc.expire(recalled_at + svc.lease_time - 1) == []  # not yet
        assert [x.other for x in svc.expire(recalled_at + svc.lease_time + 1)] == [d.other]
        await opening  # the writer gets in now
        # The holder is told, and its use of the stateid says revoked.
        await a.expect(OK, op(nfs4.OP_PUTROOTFH))
        assert seen[-1] & REVOKED_FLAG
        await a.on(fh, nfs4.NFS4ERR_DELEG_REVOKED, op(nfs4.OP_READ, nfs4.READ4args(d, 0, 10)))
        await a.on(
            fh, nfs4.NFS4ERR_DELEG_REVOKED, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d))
        )
        res = await a.expect(OK, op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([d])))
        assert res.resarray[0].value.value.tsr_status_codes == [nfs4.NFS4ERR_DELEG_REVOKED]
        await a.expect(OK, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(d)))
        assert seen[-1] & REVOKED_FLAG  # that SEQUENCE came before the FREE_STATEID
        await a.expect(OK, op(nfs4.OP_PUTROOTFH))
        assert not seen[-1] & REVOKED_FLAG
        res = await a.expect(OK, op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([d])))
        assert res.resarray[0].value.value.tsr_status_codes == [nfs4.NFS4ERR_BAD_STATEID]


async def test_test_and_free_stateid_of_a_live_delegation(tmp_path: Path) -> None:
    async with deleg_served(tmp_path, clients=1) as (_server, (a,)):
        _fh, d = await _holding_read(a)
        res = await a.expect(OK, op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([d])))
        assert res.resarray[0].value.value.tsr_status_codes == [OK]
        await a.expect(nfs4.NFS4ERR_LOCKS_HELD, op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(d)))
        await a.expect(nfs4.NFS4ERR_NOTSUPP, op(nfs4.OP_DELEGPURGE, nfs4.DELEGPURGE4args(0)))


# ---------------------------------------------------------------- the server's own file system


async def test_a_local_writer_breaks_the_kernel_lease_and_recalls(tmp_path: Path) -> None:
    """A process on the server opening the delegated file for writing blocks in the kernel
    until the delegation is returned (the lease released), then writes."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        fh, _d = await _holding_read(a)
        path = tmp_path / "export" / "f"
        returns = Returns(a)
        svc = service(server)
        assert svc.table.held(a.clientid, fh) is not None
        assert svc.table.held(a.clientid, fh).lease is not None  # type: ignore[union-attr]

        def local_write() -> None:
            with open(path, "r+b") as f:  # blocks until the lease is released
                f.write(b"LOCAL")

        writing = asyncio.ensure_future(asyncio.to_thread(local_write))
        await returns.wait()
        await writing
        assert svc.leases.breaks == 1 and a.s.stats.recalls == 1
        assert path.read_bytes().startswith(b"LOCAL")


# ---------------------------------------------------------------- CB_GETATTR


async def test_getattr_by_another_client_asks_the_write_delegation_holder(tmp_path: Path) -> None:
    """RFC 8881 10.4.3 / 20.1: GETATTR of size/change of a file under a write delegation is
    answered with the holder's view: its size, a change attribute moved forward."""
    async with deleg_served(tmp_path) as (_server, (a, b)):
        fh, _, ok = await a.open(b"w", BOTH | WANT_WRITE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        request = [(1 << nfs4.FATTR4_CHANGE) | (1 << nfs4.FATTR4_SIZE)]

        async def change_size(c: Nfs) -> tuple[int, int]:
            res = await c.on(fh, OK, op(nfs4.OP_GETATTR, nfs4.GETATTR4args(request)))
            vals = bytes(res.resarray[1].value.value.obj_attributes.attr_vals)
            return int.from_bytes(vals[:8], "big"), int.from_bytes(vals[8:16], "big")

        change0, size0 = await change_size(a)  # the holder itself: no callback
        assert size0 == 0
        asked: list[bytes] = []

        def unmodified(f: bytes) -> tuple[int, int] | None:
            asked.append(f)
            return (change0, 0) if f == fh else None

        a.s.backchannel.delegated_attrs = unmodified
        assert await change_size(b) == (change0, 0)
        assert asked == [fh]

        def modified(f: bytes) -> tuple[int, int] | None:  # 4096 bytes written, not yet sent
            asked.append(f)
            return (change0 + 1, 4096) if f == fh else None

        a.s.backchannel.delegated_attrs = modified
        change1, size1 = await change_size(b)
        assert size1 == 4096 and change1 > change0
        assert len(asked) == 2
        # Attributes other than size and change need no callback.
        await b.on(fh, OK, op(nfs4.OP_GETATTR, nfs4.GETATTR4args([1 << nfs4.FATTR4_TYPE])))
        assert len(asked) == 2


async def test_opens_made_under_a_recalled_delegation_are_claimed(tmp_path: Path) -> None:
    """RFC 8881 10.4.3 / 18.16: on recall the holder turns its local opens into real ones
    with CLAIM_DELEG_CUR_FH (and CLAIM_DELEGATE_CUR by name), then returns the delegation."""
    async with deleg_served(tmp_path) as (server, (a, b)):
        fh, d = await _holding_read(a)
        Returns(a, refuse=True)  # the test plays the holder's part
        recalls = Recalls(server)
        opening = asyncio.ensure_future(b.open(b"f", WRITE, how=NOCREATE, owner=b"w"))
        await recalls.event.wait()
        by_fh = nfs4.open_claim4(nfs4.CLAIM_DELEG_CUR_FH, d)
        res = await a.on(fh, OK, open_op(None, READ, how=NOCREATE, owner=b"l1", claim=by_fh))
        ok = res.resarray[1].value.value
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE  # not again
        by_name = nfs4.open_claim4(nfs4.CLAIM_DELEGATE_CUR, nfs4.open_claim_delegate_cur4(d, b"f"))
        await a.expect(
            OK, op(nfs4.OP_PUTROOTFH), open_op(None, READ, how=NOCREATE, owner=b"l2", claim=by_name)
        )
        other = nfs4.stateid4(1, d.other[:4] + b"\xff" * 8)  # ours, never issued
        bad = nfs4.open_claim4(nfs4.CLAIM_DELEG_CUR_FH, other)
        await a.on(
            fh, nfs4.NFS4ERR_BAD_STATEID, open_op(None, READ, how=NOCREATE, owner=b"l3", claim=bad)
        )
        await a.on(fh, OK, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))
        await opening
        assert a.s.stats.recalls == 1


# ---------------------------------------------------------------- write delegations, write leases


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def _leased(d: Delegation | None) -> int:
    """The kernel lease the delegation's descriptor holds (F_GETLEASE)."""
    assert d is not None and isinstance(d.lease, Lease)
    return fcntl.fcntl(d.lease.fd, F_GETLEASE)


async def test_a_write_delegation_holds_a_kernel_write_lease_a_local_reader_breaks(
    tmp_path: Path,
) -> None:
    """The write lease is taken on the holder's own open (the file's only open file
    description), so any local open, even for reading, blocks until the delegation is back."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        fh, _s, ok = await a.open(b"w", BOTH | WANT_WRITE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        svc = service(server)
        deleg = svc.table.held(a.clientid, fh)
        assert _leased(deleg) == fcntl.F_WRLCK
        await a.write(fh, deleg_of(ok).stateid, 0, b"remote")
        path = tmp_path / "export" / "w"
        returns = Returns(a)

        def local_read() -> bytes:
            with open(path, "rb") as f:  # blocks until the lease is released
                return f.read()

        reading = asyncio.ensure_future(asyncio.to_thread(local_read))
        await returns.wait()
        assert await reading == b"remote"
        assert svc.leases.breaks == 1 and a.s.stats.recalls == 1
        assert svc.table.held(a.clientid, fh) is None


async def test_close_under_a_write_delegation_keeps_the_lease_until_delegreturn(
    tmp_path: Path,
) -> None:
    """CLOSE of the open hands its descriptor to the write delegation: still leased (a local
    open would block), closed at DELEGRETURN, after which a local open goes through at once;
    no descriptor is left behind."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"w")
        path = tmp_path / "export" / "w"
        before = _fd_count()
        fh, sid, ok = await a.open(b"w", BOTH | WANT_WRITE, how=NOCREATE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        d = deleg_of(ok).stateid
        svc = service(server)
        deleg = svc.table.held(a.clientid, fh)
        await a.close(fh, sid)
        assert _leased(deleg) == fcntl.F_WRLCK
        await a.write(fh, d, 0, b"after close")  # the delegation stateid still serves
        await a.on(fh, OK, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # EWOULDBLOCK if still leased
        try:
            assert os.read(fd, 11) == b"after close"
        finally:
            os.close(fd)
        assert svc.leases.breaks == 0 and a.s.stats.recalls == 0
        assert _fd_count() == before


async def test_no_write_delegation_without_a_write_lease(tmp_path: Path) -> None:
    """A local process holding the file open: the kernel gives no write lease, so no write
    delegation (contention), where one used to be granted unprotected."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"w")
        with open(tmp_path / "export" / "w", "rb"):
            _, _, ok = await a.open(b"w", BOTH | WANT_WRITE, how=NOCREATE)
            assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
            assert deleg_of(ok).ond_why == nfs4.WND4_CONTENTION
            _, _, ok = await a.open(b"w", READ | WANT_WRITE, how=NOCREATE, owner=b"r")
            assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_NONE_EXT
            assert deleg_of(ok).ond_why == nfs4.WND4_CONTENTION
        assert len(service(server).table) == 0


async def test_the_holders_second_open_recalls_its_write_delegation_first(
    tmp_path: Path,
) -> None:
    """The server opening the file for another open-owner of the holder would break its own
    write lease and block on it: the delegation is recalled and the lease let go first."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        fh, _s, ok = await a.open(b"w", BOTH | WANT_WRITE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_WRITE
        returns = Returns(a)
        recalls = Recalls(server)
        svc = service(server)
        await a.open(b"w", READ, how=NOCREATE, owner=b"o2")
        assert [x.fh for x in recalls.sent] == [fh]  # sent before the OPEN was answered
        await returns.wait()
        assert svc.leases.breaks == 0 and a.s.stats.recalls == 1
        assert svc.table.held(a.clientid, fh) is None


async def test_a_revoked_write_delegation_lets_its_closed_descriptor_go(tmp_path: Path) -> None:
    """A holder that closed its open and ignores the recall: a local reader waits until the
    delegation is revoked, then the borrowed descriptor is closed and the reader goes on."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"w", b"data")
        path = tmp_path / "export" / "w"
        before = _fd_count()
        fh, sid, ok = await a.open(b"w", BOTH | WANT_WRITE, how=NOCREATE)
        d = deleg_of(ok).stateid
        await a.close(fh, sid)
        Returns(a, refuse=True)
        recalls = Recalls(server)
        svc = service(server)
        assert _leased(svc.table.held(a.clientid, fh)) == fcntl.F_WRLCK

        def local_read() -> bytes:
            with open(path, "rb") as f:  # blocks until the lease is released
                return f.read()

        reading = asyncio.ensure_future(asyncio.to_thread(local_read))
        await recalls.event.wait()
        recalled_at = recalls.sent[0].recalled
        assert recalled_at is not None and not reading.done()
        assert [x.other for x in svc.expire(recalled_at + svc.lease_time + 1)] == [d.other]
        assert await reading == b"data"
        assert _fd_count() == before


async def test_reads_under_a_read_delegation_after_close_use_the_kept_open_file(
    tmp_path: Path,
) -> None:
    """The Linux client reads with its read delegation's stateid once it closed the file: those
    READs go through the holder's open file, kept until the delegation goes (not a new open of
    the file for every READ), and no descriptor is left behind afterwards."""
    async with deleg_served(tmp_path, clients=1) as (server, (a,)):
        await make_file(a, b"r", b"read me")
        before = _fd_count()
        fh, sid, ok = await a.open(b"r", READ | WANT_READ, how=NOCREATE)
        assert ok.delegation.delegation_type == nfs4.OPEN_DELEGATE_READ
        d = deleg_of(ok).stateid
        held = service(server).table.held(a.clientid, fh)
        assert held is not None and held.file is not None
        await a.close(fh, sid)
        sm = server.state.state_manager if server.state is not None else None
        assert sm is not None
        assert sm.io_file(a.clientid, d, fh, write=False) is held.file
        assert await a.read(fh, d, 0, 100) == (b"read me", True)
        await a.on(fh, OK, op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(d)))
        assert _fd_count() == before
