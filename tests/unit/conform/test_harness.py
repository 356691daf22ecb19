"""The conformance harness against our own server: every check passes over TCP and over
RPC-over-RDMA (the in-process provider), and a server broken on purpose for one rule makes
exactly the checks of that rule FAIL, so no check passes vacuously."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.conform.registry import Result, all_checks
from nfsrdma.conform.runner import Outcome, run_checks
from nfsrdma.xdr.gen import nfs4

from .servers import Mutation, RdmaFault, Replying, served


async def run_all(
    export: Path,
    transport: str = "tcp",
    mutation: Mutation | None = None,
    lease_time: int | None = None,
) -> list[Outcome]:
    """Every check; the lease-renewal check (SS-30.2) runs only with a short ``lease_time``
    (by default the server's 90 s lease makes it SKIP)."""
    async with served(export, transport, mutation, lease_time=lease_time) as (h, server):
        outcomes = await run_checks(h, all_checks(), limit=30)
        if mutation is not None:
            assert getattr(server, "mutated", 0) > 0, "the mutation never applied"
    return outcomes


def by_result(outcomes: list[Outcome]) -> dict[str, str]:
    return {o.check.id: o.result.value for o in outcomes}


def failing(outcomes: list[Outcome]) -> set[str]:
    return {o.check.id for o in outcomes if o.result is Result.FAIL}


# What the harness finds wrong in our own server, per transport (nothing: every check passes).
KNOWN_FAILURES: dict[str, set[str]] = {"tcp": set(), "rdma": set()}


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
async def test_our_server_passes_every_check(tmp_path: Path, transport: str) -> None:
    outcomes = await run_all(tmp_path, transport, lease_time=3)
    assert len(outcomes) == len(all_checks()) >= 120
    details = {
        o.check.id: o.detail
        for o in outcomes
        if o.result is not Result.PASS
        and o.check.id not in KNOWN_FAILURES[transport]
        and transport in o.check.transports
    }
    assert details == {}
    skipped = {o.check.id for o in outcomes if o.result is Result.SKIP}
    assert skipped == {c.id for c in all_checks() if transport not in c.transports}
    if transport == "tcp":
        assert skipped and all(c.transports == ("rdma",) for c in all_checks() if c.id in skipped)
    assert failing(outcomes) == KNOWN_FAILURES[transport]
    assert list(tmp_path.iterdir()) == []  # the scratch directory was removed


# -- misbehaving servers ----------------------------------------------------------------------
def _seq_args(args: nfs4.COMPOUND4args) -> nfs4.SEQUENCE4args | None:
    if args.argarray and args.argarray[0].argop == nfs4.OP_SEQUENCE:
        v = args.argarray[0].value
        assert isinstance(v, nfs4.SEQUENCE4args)
        return v
    return None


def _first_status(res: nfs4.COMPOUND4res) -> int | None:
    if not res.resarray:
        return None
    v = res.resarray[0].value
    return int(getattr(v, dataclasses.fields(v)[0].name))


def never_misordered(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    """SEQUENCE answers a misordered seqid as if it were new (and runs nothing else)."""
    sa = _seq_args(args)
    if sa is None or _first_status(res) != nfs4.NFS4ERR_SEQ_MISORDERED:
        return None
    ok = nfs4.SEQUENCE4resok(sa.sa_sessionid, sa.sa_sequenceid, sa.sa_slotid, 7, 7, 0)
    seq = nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4_OK, ok))
    return nfs4.COMPOUND4res(nfs4.NFS4_OK, res.tag, [seq])


def badslot_as_misordered(
    args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
) -> nfs4.COMPOUND4res | None:
    if _first_status(res) != nfs4.NFS4ERR_BADSLOT:
        return None
    seq = nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4ERR_SEQ_MISORDERED))
    return nfs4.COMPOUND4res(nfs4.NFS4ERR_SEQ_MISORDERED, res.tag, [seq])


class ReplayDiffers:
    """A reply cache that answers a retry with a different last result (a GETFH with another
    file handle)."""

    def __init__(self) -> None:
        self.seen: set[tuple[bytes, int, int]] = set()

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        sa = _seq_args(args)
        if sa is None or _first_status(res) != nfs4.NFS4_OK:
            return None
        key = (sa.sa_sessionid, sa.sa_slotid, sa.sa_sequenceid)
        if key not in self.seen:
            self.seen.add(key)
            return None
        ok = _ok_of(res, nfs4.OP_GETFH)
        if ok is None:
            return None
        ok.object = bytes(ok.object) + b"\0"
        return res


class RefreshedSequenceFields:
    """Not a fault: SEQUENCE reports slot and status fields that change from reply to reply
    (as knfsd does when it replays: it encodes SEQUENCE afresh, e.g. CB_PATH_DOWN cleared)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, nfs4.OP_SEQUENCE)
        if ok is None:
            return None
        self.n += 1
        ok.sr_status_flags = self.n & 1  # SEQ4_STATUS_CB_PATH_DOWN every other reply
        ok.sr_target_highest_slotid = max(0, ok.sr_highest_slotid - (self.n & 1))
        return res


class UncachedRetryRerun:
    """A retry of an uncached SEQUENCE, PUTFH, CREATE is run again (CREATE then finds EXIST)."""

    def __init__(self) -> None:
        self.seen: set[tuple[bytes, int, int]] = set()

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        sa = _seq_args(args)
        kinds = [a.argop for a in args.argarray]
        if (
            sa is None
            or sa.sa_cachethis
            or kinds != [nfs4.OP_SEQUENCE, nfs4.OP_PUTFH, nfs4.OP_CREATE]
        ):
            return None
        key = (sa.sa_sessionid, sa.sa_slotid, sa.sa_sequenceid)
        if key not in self.seen:
            self.seen.add(key)
            return None
        ok = nfs4.SEQUENCE4resok(sa.sa_sessionid, sa.sa_sequenceid, sa.sa_slotid, 7, 7, 0)
        results = [
            nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4_OK, ok)),
            nfs4.nfs_resop4(nfs4.OP_PUTFH, nfs4.PUTFH4res(nfs4.NFS4_OK)),
            nfs4.nfs_resop4(nfs4.OP_CREATE, nfs4.CREATE4res(nfs4.NFS4ERR_EXIST)),
        ]
        return nfs4.COMPOUND4res(nfs4.NFS4ERR_EXIST, res.tag, results)


def no_pnfs_role(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    if not res.resarray or res.resarray[0].resop != nfs4.OP_EXCHANGE_ID or res.status:
        return None
    eir = res.resarray[0].value.value  # type: ignore[union-attr]
    assert isinstance(eir, nfs4.EXCHANGE_ID4resok)
    eir.eir_flags &= ~nfs4.EXCHGID4_FLAG_MASK_PNFS
    return res


def tag_dropped(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    if not res.tag:
        return None
    res.tag = b""
    return res


def not_in_session_as_badsession(
    args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
) -> nfs4.COMPOUND4res | None:
    if res.status != nfs4.NFS4ERR_OP_NOT_IN_SESSION:
        return None
    last = res.resarray[-1]
    last.value = type(last.value)(nfs4.NFS4ERR_BADSESSION)  # type: ignore[call-arg,misc]
    res.status = nfs4.NFS4ERR_BADSESSION
    return res


def read_corrupted(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    for r in res.resarray:
        if r.resop == nfs4.OP_READ and r.value.status == nfs4.NFS4_OK:  # type: ignore[union-attr]
            ok = r.value.value  # type: ignore[union-attr]
            assert isinstance(ok, nfs4.READ4resok)
            if len(ok.data):
                ok.data = bytes([ok.data[0] ^ 1]) + bytes(ok.data[1:])
                return res
    return None


def lockt_never_denied(
    args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
) -> nfs4.COMPOUND4res | None:
    last = res.resarray[-1] if res.resarray else None
    if last is None or last.resop != nfs4.OP_LOCKT or res.status != nfs4.NFS4ERR_DENIED:
        return None
    last.value = nfs4.LOCKT4res(nfs4.NFS4_OK)
    res.status = nfs4.NFS4_OK
    return res


def state_revoked(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    """SEQUENCE says some state was revoked although the client renewed its lease."""
    if _first_status(res) != nfs4.NFS4_OK or _seq_args(args) is None:
        return None
    ok = res.resarray[0].value.value  # type: ignore[union-attr]
    assert isinstance(ok, nfs4.SEQUENCE4resok)
    ok.sr_status_flags |= nfs4.SEQ4_STATUS_EXPIRED_SOME_STATE_REVOKED
    return res


CASES: list[tuple[str, Mutation, set[str]]] = [
    ("never SEQ_MISORDERED", never_misordered, {"SS-6.3", "SS-6.4"}),
    ("BADSLOT answered SEQ_MISORDERED", badslot_as_misordered, {"SS-6.2"}),
    ("a replay differs from the original", ReplayDiffers(), {"SS-7.1", "SS-7.2", "SS-7.5"}),
    ("an uncached retry is run again", UncachedRetryRerun(), {"SS-7.3"}),
    ("no pNFS role flag", no_pnfs_role, {"CONF-EID-1"}),
    ("tag not echoed", tag_dropped, {"CONF-COMP-2"}),
    ("OP_NOT_IN_SESSION answered BADSESSION", not_in_session_as_badsession, {"SS-3.1"}),
    (
        "READ data corrupted",
        read_corrupted,
        {"CONF-OPS-3", "CONF-OPS-13", "CONF-OPS-18", "CONF-OPS-43", "CONF-OPS-45"},
    ),
    ("LOCKT never DENIED", lockt_never_denied, {"CONF-OPS-6"}),
    ("state revoked despite renewal", state_revoked, {"SS-30.2"}),
]


@pytest.mark.parametrize(("why", "mutation", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_a_server_broken_for_one_rule_fails_exactly_its_checks(
    tmp_path: Path, why: str, mutation: Mutation, expected: set[str]
) -> None:
    lease = 3 if "SS-30.2" in expected else None
    outcomes = await run_all(tmp_path, "tcp", mutation, lease_time=lease)
    assert failing(outcomes) == expected, by_result(outcomes)
    for o in outcomes:
        if o.check.id in expected:
            assert o.expected and o.got and o.exchanges  # the report says what and shows it


# -- misbehaving RPC-over-RDMA responders -----------------------------------------------------
def drops_bad_headers(conn: Any) -> None:
    """A responder that silently drops every header it cannot process (no RDMA_ERROR)."""
    conn._bad_header = lambda e: None


def err_chunk_for_everything(conn: Any) -> None:
    """A responder that answers an unsupported version with ERR_CHUNK instead of ERR_VERS."""
    from nfsrdma.transport.rdma import header as hdr

    original = conn._bad_header

    def bad_header(e: Any) -> None:
        if e.err == hdr.ERR_VERS:
            e.err = hdr.ERR_CHUNK
        original(e)

    conn._bad_header = bad_header


RDMA_CASES: list[tuple[str, RdmaFault, set[str]]] = [
    (
        "bad headers dropped",
        drops_bad_headers,
        {c.id for c in all_checks() if c.id.startswith(("TR-3.", "TR-4.", "TR-17."))},
    ),
    ("ERR_CHUNK instead of ERR_VERS", err_chunk_for_everything, {"TR-3.1", "TR-3.2", "TR-3.3"}),
]


@pytest.mark.parametrize(("why", "fault", "expected"), RDMA_CASES, ids=[c[0] for c in RDMA_CASES])
async def test_a_responder_broken_for_one_rule_fails_exactly_its_checks(
    tmp_path: Path, why: str, fault: RdmaFault, expected: set[str]
) -> None:
    checks = [c for c in all_checks() if c.group == "rfc8166"]
    async with served(tmp_path, "rdma", rdma_fault=fault, timeout=1.0) as (h, _):
        outcomes = await run_checks(h, checks, limit=30)
    assert failing(outcomes) == expected, by_result(outcomes)


# -- one error status answered wrongly ---------------------------------------------------------
def replaces(status: int) -> Mutation:
    """A server that answers NFS4ERR_SERVERFAULT wherever it should answer ``status``."""

    def mutation(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
        changed = False
        for r in res.resarray:
            v = r.value
            assert v is not None
            if int(getattr(v, dataclasses.fields(v)[0].name)) == status:
                r.value = type(v)(nfs4.NFS4ERR_SERVERFAULT)  # type: ignore[call-arg]
                changed = True
        if res.status == status:
            res.status = nfs4.NFS4ERR_SERVERFAULT
            changed = True
        return res if changed else None

    return mutation


STATUS_CASES: list[tuple[int, set[str]]] = [
    (nfs4.NFS4ERR_SEQ_MISORDERED, {"SS-6.3", "SS-6.4", "SS-10.3"}),
    (nfs4.NFS4ERR_NOT_ONLY_OP, {"SS-3.3", "SS-3.4", "SS-3.5", "SS-3.6", "SS-3.7"}),
    (nfs4.NFS4ERR_SEQUENCE_POS, {"SS-3.2"}),
    (nfs4.NFS4ERR_TOO_MANY_OPS, {"SS-27.1"}),
    (nfs4.NFS4ERR_STALE_CLIENTID, {"SS-10.4", "CONF-DC-1", "CONF-DC-2", "CONF-EID-2"}),
    (
        nfs4.NFS4ERR_BADSESSION,
        {"SS-6.6", "SS-11.2", "CONF-DS-1", "CONF-DS-2", "CONF-DS-3", "CONF-DS-4"},
    ),
    (nfs4.NFS4ERR_CLIENTID_BUSY, {"CONF-DC-1"}),
    (nfs4.NFS4ERR_NOTSUPP, {"SS-30.1", "SS-30.3", "SS-30.4", "SS-30.5", "SS-30.6"}),
    (nfs4.NFS4ERR_MINOR_VERS_MISMATCH, {"CONF-COMP-1"}),
    (nfs4.NFS4ERR_OP_ILLEGAL, {"CONF-COMP-3"}),
    (
        nfs4.NFS4ERR_INVAL,
        {"CONF-EID-5", "CONF-OPS-19", "CONF-OPS-27", "CONF-OPS-28", "CONF-OPS-29"},
    ),
    (
        nfs4.NFS4ERR_NOENT,
        {"CONF-OPS-1", "CONF-OPS-11", "CONF-OPS-14", "CONF-OPS-20", "CONF-OPS-24"}
        | {"CONF-OPS-39", "SS-7.5"},
    ),
    (nfs4.NFS4ERR_NOTDIR, {"CONF-OPS-10"}),
    (nfs4.NFS4ERR_NOFILEHANDLE, {"CONF-OPS-8", "CONF-OPS-41"}),
    (nfs4.NFS4ERR_BADHANDLE, {"CONF-OPS-9"}),
    (nfs4.NFS4ERR_EXIST, {"CONF-OPS-12", "CONF-OPS-23"}),
    (nfs4.NFS4ERR_ISDIR, {"CONF-OPS-16", "CONF-OPS-25", "CONF-OPS-26", "CONF-OPS-38"}),
    (nfs4.NFS4ERR_BAD_STATEID, {"CONF-OPS-7"}),
    (nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE, {"SS-7.4"}),
    (nfs4.NFS4ERR_REP_TOO_BIG, {"SS-21.1"}),
    (nfs4.NFS4ERR_REQ_TOO_BIG, {"SS-21.2"}),
]


@pytest.mark.parametrize(
    ("status", "expected"), STATUS_CASES, ids=[nfs4.nfsstat4(c[0]).name for c in STATUS_CASES]
)
async def test_a_server_with_one_wrong_error_fails_exactly_its_checks(
    tmp_path: Path, status: int, expected: set[str]
) -> None:
    outcomes = await run_all(tmp_path, "tcp", replaces(status))
    assert failing(outcomes) == expected, by_result(outcomes)


# -- one result field wrong -------------------------------------------------------------------
def _ok_of(res: nfs4.COMPOUND4res, opnum: int) -> Any:
    for r in res.resarray:
        if r.resop == opnum and getattr(r.value, "value", None) is not None:
            return r.value.value  # type: ignore[union-attr]
    return None


def field_mutation(opnum: int, change: Any) -> Mutation:
    """``change(resok, args)`` alters the first successful ``opnum`` result; True if it did."""

    def mutation(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, opnum)
        return res if ok is not None and change(ok, args) else None

    return mutation


def _set(obj: Any, name: str, value: Any) -> bool:
    setattr(obj, name, value)
    return True


FIELD_CASES: list[tuple[str, Mutation, set[str]]] = [
    (
        "CONFIRMED_R never set",
        field_mutation(
            nfs4.OP_EXCHANGE_ID,
            lambda ok, a: _set(ok, "eir_flags", ok.eir_flags & ~nfs4.EXCHGID4_FLAG_CONFIRMED_R),
        ),
        {"CONF-EID-3"},
    ),
    (
        "sr_slotid wrong",
        field_mutation(nfs4.OP_SEQUENCE, lambda ok, a: _set(ok, "sr_slotid", ok.sr_slotid + 1)),
        {"SS-6.1"},
    ),
    (
        "csr_sequence wrong",
        field_mutation(
            nfs4.OP_CREATE_SESSION, lambda ok, a: _set(ok, "csr_sequence", ok.csr_sequence + 1)
        ),
        {"SS-10.1"},
    ),
    (
        "BIND_CONN_TO_SESSION says BOTH for FORE",
        field_mutation(
            nfs4.OP_BIND_CONN_TO_SESSION, lambda ok, a: _set(ok, "bctsr_dir", nfs4.CDFS4_BOTH)
        ),
        {"SS-11.1"},
    ),
    (
        "READ eof inverted",
        field_mutation(nfs4.OP_READ, lambda ok, a: _set(ok, "eof", not ok.eof)),
        {"CONF-OPS-3", "CONF-OPS-4", "CONF-OPS-13", "CONF-OPS-43"},
    ),
    (
        "READDIR loses the last entry",
        field_mutation(
            nfs4.OP_READDIR,
            lambda ok, a: (
                bool(ok.reply.entries) and _set(ok.reply, "entries", ok.reply.entries[:-1])
            ),
        ),
        {"CONF-OPS-5"},
    ),
    (
        "READLINK text altered",
        field_mutation(nfs4.OP_READLINK, lambda ok, a: _set(ok, "link", bytes(ok.link) + b"x")),
        {"CONF-OPS-15"},
    ),
    (
        "COMMIT verifier differs",
        field_mutation(
            nfs4.OP_COMMIT, lambda ok, a: _set(ok, "writeverf", bytes(b ^ 1 for b in ok.writeverf))
        ),
        {"CONF-OPS-17"},
    ),
    (
        "GETFH after LOOKUP differs",
        field_mutation(
            nfs4.OP_GETFH,
            lambda ok, a: (
                any(x.argop == nfs4.OP_LOOKUP for x in a.argarray)
                and len(a.argarray) == 4
                and _set(ok, "object", bytes(ok.object) + b"\0")
            ),
        ),
        {"CONF-OPS-2", "CONF-OPS-14", "CONF-OPS-37"},
    ),
]


@pytest.mark.parametrize(
    ("why", "mutation", "expected"), FIELD_CASES, ids=[c[0] for c in FIELD_CASES]
)
async def test_a_server_with_one_wrong_field_fails_exactly_its_checks(
    tmp_path: Path, why: str, mutation: Mutation, expected: set[str]
) -> None:
    outcomes = await run_all(tmp_path, "tcp", mutation)
    assert failing(outcomes) == expected, by_result(outcomes)


# -- stateful misbehaviour --------------------------------------------------------------------
class RebootKeepsClientId:
    """A client that comes back with a new verifier gets its old client ID again."""

    def __init__(self) -> None:
        self.first: dict[bytes, tuple[bytes, int]] = {}

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, nfs4.OP_EXCHANGE_ID)
        if ok is None:
            return None
        eia = args.argarray[0].value
        assert isinstance(eia, nfs4.EXCHANGE_ID4args)
        owner = eia.eia_clientowner
        first = self.first.setdefault(owner.co_ownerid, (owner.co_verifier, ok.eir_clientid))
        verifier, old = first
        if verifier == owner.co_verifier:
            return None
        ok.eir_clientid = old
        return res


class CreateSessionReplayDiffers:
    """A CREATE_SESSION replay gets a different session ID than the original."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, nfs4.OP_CREATE_SESSION)
        if ok is None:
            return None
        csa = args.argarray[0].value
        assert isinstance(csa, nfs4.CREATE_SESSION4args)
        key = (csa.csa_clientid, csa.csa_sequence)
        if key not in self.seen:
            self.seen.add(key)
            return None
        ok.csr_sessionid = bytes(b ^ 0xFF for b in ok.csr_sessionid)
        return res


class OneSessionIdPerClient:
    """Every session of a client ID is reported with the first session's ID."""

    def __init__(self) -> None:
        self.first: dict[int, bytes] = {}

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, nfs4.OP_CREATE_SESSION)
        if ok is None:
            return None
        csa = args.argarray[0].value
        assert isinstance(csa, nfs4.CREATE_SESSION4args)
        first = self.first.setdefault(csa.csa_clientid, ok.csr_sessionid)
        if first == ok.csr_sessionid:
            return None
        ok.csr_sessionid = first
        return res


def fore_or_both_answered_back(
    args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
) -> nfs4.COMPOUND4res | None:
    ok = _ok_of(res, nfs4.OP_BIND_CONN_TO_SESSION)
    if ok is None:
        return None
    bind = args.argarray[0].value
    assert isinstance(bind, nfs4.BIND_CONN_TO_SESSION4args)
    if bind.bctsa_dir != nfs4.CDFC4_FORE_OR_BOTH:
        return None
    ok.bctsr_dir = nfs4.CDFS4_BACK
    return res


def only_slot_zero(args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res) -> nfs4.COMPOUND4res | None:
    """Slot 1 shares slot 0's sequence: its seqid 1 is misordered."""
    sa = _seq_args(args)
    if sa is None or sa.sa_slotid != 1 or _first_status(res) != nfs4.NFS4_OK:
        return None
    seq = nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4ERR_SEQ_MISORDERED))
    return nfs4.COMPOUND4res(nfs4.NFS4ERR_SEQ_MISORDERED, res.tag, [seq])


class SessionsDieWithTheirConnection:
    """A session is usable only while the connection that created it is open."""

    def __init__(self) -> None:
        self.creator: dict[bytes, Any] = {}

    def __call__(
        self, args: nfs4.COMPOUND4args, res: nfs4.COMPOUND4res
    ) -> nfs4.COMPOUND4res | None:
        ok = _ok_of(res, nfs4.OP_CREATE_SESSION)
        if ok is not None:
            self.creator.setdefault(ok.csr_sessionid, Replying.conn)
            return None
        sa = _seq_args(args)
        creator = self.creator.get(sa.sa_sessionid) if sa is not None else None
        if creator is None or not creator.conn.closed:
            return None
        seq = nfs4.nfs_resop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4res(nfs4.NFS4ERR_BADSESSION))
        return nfs4.COMPOUND4res(nfs4.NFS4ERR_BADSESSION, res.tag, [seq])


STATEFUL_CASES: list[tuple[str, Callable[[], Mutation], set[str]]] = [
    ("a rebooted client keeps its client ID", RebootKeepsClientId, {"CONF-EID-4"}),
    ("CREATE_SESSION replay differs", CreateSessionReplayDiffers, {"SS-10.2", "SS-10.5"}),
    ("one session ID per client", OneSessionIdPerClient, {"SS-4"}),
    ("FORE_OR_BOTH answered BACK", lambda: fore_or_both_answered_back, {"SS-5.1"}),
    (
        "slot 1 shares slot 0's seqids",
        lambda: only_slot_zero,
        {"SS-6.5", "CONF-DS-4", "SS-13.1"},
    ),
    (
        "sessions die with their connection",
        SessionsDieWithTheirConnection,
        {"SS-2.1", "SS-7.2", "SS-13.1"},
    ),
]


@pytest.mark.parametrize(
    ("why", "make", "expected"), STATEFUL_CASES, ids=[c[0] for c in STATEFUL_CASES]
)
async def test_a_server_with_wrong_session_state_fails_exactly_its_checks(
    tmp_path: Path, why: str, make: Callable[[], Mutation], expected: set[str]
) -> None:
    outcomes = await run_all(tmp_path, "tcp", make())
    assert failing(outcomes) == expected, by_result(outcomes)


# That every check is made to fail by one of these servers (or those of test_more_checks.py)
# is tested in test_more_checks.py.


async def test_replays_may_refresh_sequence_slot_and_status_fields(tmp_path: Path) -> None:
    """SS-7.x compare a replay with the original but for SEQUENCE's sr_highest_slotid,
    sr_target_highest_slotid and sr_status_flags (found against knfsd, which re-encodes
    SEQUENCE in a replay)."""
    checks = [c for c in all_checks() if c.id.startswith("SS-7.")]
    async with served(tmp_path, mutation=RefreshedSequenceFields()) as (h, server):
        outcomes = await run_checks(h, checks, limit=30)
        assert getattr(server, "mutated", 0) > 0
    assert {o.check.id: o.result for o in outcomes} == {c.id: Result.PASS for c in checks}
