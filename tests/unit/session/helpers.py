"""Builders shared by the session-layer tests: arguments, a deterministic server, a reply."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from nfsrdma.session.records import Session
from nfsrdma.session.server import ServerSessions
from nfsrdma.xdr.gen import nfs4

PRINCIPAL: Hashable = (True, 0, 0, ())
OTHER_PRINCIPAL: Hashable = (True, 1000, 1000, ())
CB_PROGRAM = 0x40000000


@dataclass
class Reply:
    """Stands for compound.py's EncodedReply: all the cache needs is ``size``."""

    size: int
    tag: str = ""


class Conn:
    """A connection identity (the server uses RpcConnection objects as such)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Conn({self.name})"


def make_sessions(**kw: Any) -> ServerSessions:
    kw.setdefault("lease_time", 90)
    kw.setdefault("slots", 8)
    kw.setdefault("max_response_size_cached", 4096)
    kw.setdefault("random_bytes", random.Random(1).randbytes)
    return ServerSessions(**kw)


def attrs(
    req: int = 65536,
    resp: int = 65536,
    cached: int = 4096,
    ops: int = 16,
    reqs: int = 8,
    ird: list[int] | None = None,
    pad: int = 0,
) -> nfs4.channel_attrs4:
    return nfs4.channel_attrs4(pad, req, resp, cached, ops, reqs, list(ird or []))


def back_attrs(reqs: int = 1) -> nfs4.channel_attrs4:
    # What the Linux client offers: 4 KiB each way, nothing cached, 2 operations, 1 slot.
    return nfs4.channel_attrs4(0, 4096, 4096, 0, 2, reqs, [])


def eid(
    owner: bytes = b"client-a",
    verifier: bytes = b"verifie1",
    flags: int = 0,
    how: nfs4.state_protect_how4 = nfs4.SP4_NONE,
    value: Any = None,
) -> nfs4.EXCHANGE_ID4args:
    return nfs4.EXCHANGE_ID4args(
        nfs4.client_owner4(verifier, owner),
        flags,
        nfs4.state_protect4_a(how, value),
        [nfs4.nfs_impl_id4(b"kernel.org", b"Linux", nfs4.nfstime4(0, 0))],
    )


def cs(
    clientid: int,
    seq: int,
    flags: int = 0,
    fore: nfs4.channel_attrs4 | None = None,
    back: nfs4.channel_attrs4 | None = None,
    sec: list[nfs4.callback_sec_parms4] | None = None,
) -> nfs4.CREATE_SESSION4args:
    return nfs4.CREATE_SESSION4args(
        clientid,
        seq,
        flags,
        fore or attrs(),
        back or back_attrs(),
        CB_PROGRAM,
        [nfs4.callback_sec_parms4(0)] if sec is None else sec,
    )


def seq(
    sessionid: bytes, seqid: int, slot: int = 0, highest: int | None = None, cachethis: bool = True
) -> nfs4.SEQUENCE4args:
    return nfs4.SEQUENCE4args(
        sessionid, seqid, slot, slot if highest is None else highest, cachethis
    )


def new_session(
    s: ServerSessions,
    conn: Hashable,
    owner: bytes = b"client-a",
    now: float = 0.0,
    flags: int = nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
    principal: Hashable = PRINCIPAL,
) -> Session:
    r = s.exchange_id(eid(owner), principal=principal, now=now)
    ok = s.create_session(
        cs(r.eir_clientid, r.eir_sequenceid, flags), conn=conn, principal=principal, now=now
    )
    session = s.session(ok.csr_sessionid)
    assert session is not None
    return session


# -- COMPOUND operations, for the tests that go through compound.py -----------------------
def op(opnum: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(opnum), args)


def op_exchange_id(owner: bytes, verifier: bytes = b"boot0001") -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_EXCHANGE_ID,
        nfs4.EXCHANGE_ID4args(
            nfs4.client_owner4(verifier, owner),
            nfs4.EXCHGID4_FLAG_SUPP_MOVED_REFER | nfs4.EXCHGID4_FLAG_BIND_PRINC_STATEID,
            nfs4.state_protect4_a(nfs4.SP4_NONE),
            [],
        ),
    )


def op_create_session(clientid: int, sequence: int) -> nfs4.nfs_argop4:
    # What a Linux client sends (UL-33).
    fore = nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 64, [])
    back = nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [])
    return op(
        nfs4.OP_CREATE_SESSION,
        nfs4.CREATE_SESSION4args(
            clientid,
            sequence,
            nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN | nfs4.CREATE_SESSION4_FLAG_PERSIST,
            fore,
            back,
            0x40000000,
            [nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "client-host", 0, 0, []))],
        ),
    )


def op_sequence(
    sessionid: bytes, seqid: int, slot: int = 0, cachethis: bool = True
) -> nfs4.nfs_argop4:
    return op(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(sessionid, seqid, slot, slot, cachethis))


def op_reclaim_complete(one_fs: bool = False) -> nfs4.nfs_argop4:
    return op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(one_fs))


def resok(res: nfs4.COMPOUND4res, i: int) -> Any:
    """The result body of operation ``i`` (the arm of its union)."""
    return getattr(res.resarray[i].value, "value", None)


def statuses(res: nfs4.COMPOUND4res) -> list[int]:
    out = []
    for r in res.resarray:
        v: Any = r.value
        out.append(int(getattr(v, dataclasses.fields(v)[0].name)))
    return out
