"""The checks added for issue 14's second round (RFC 8881 operation errors and session rules,
RFC 8166 chunk lists and credits, RFC 8267 DDP, RFC 8797 private data, RFC 8167 back channel):
each is made to FAIL by a server broken on purpose for its rule (a reply mutation over TCP or
RPC-over-RDMA, or a fault in the responder's transport), and nothing else fails."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.conform.registry import all_checks, select
from nfsrdma.conform.runner import run_checks
from nfsrdma.transport.rdma import header as hdr
from nfsrdma.xdr.gen import nfs4

from .servers import Mutation, RdmaFault, served
from .test_harness import (
    ReplayDiffers,
    _set,
    failing,
    field_mutation,
    read_corrupted,
    replaces,
    run_all,
)

# -- TCP: one error status answered wrongly, one result field wrong --------------------------
STATUS_CASES: list[tuple[int, set[str]]] = [
    (nfs4.NFS4ERR_BADTYPE, {"CONF-OPS-21"}),
    (nfs4.NFS4ERR_NOTEMPTY, {"CONF-OPS-22"}),
    (nfs4.NFS4ERR_STALE_STATEID, {"CONF-OPS-31", "CONF-OPS-32"}),
    (nfs4.NFS4ERR_NOT_SAME, {"CONF-OPS-35"}),
    (nfs4.NFS4ERR_SAME, {"CONF-OPS-36"}),
    (nfs4.NFS4ERR_SHARE_DENIED, {"CONF-OPS-42"}),
    (nfs4.NFS4ERR_COMPLETE_ALREADY, {"CONF-RC-1"}),
    (nfs4.NFS4ERR_RESTOREFH, {"CONF-OPS-33"}),
    (nfs4.NFS4ERR_DENIED, {"CONF-OPS-6", "CONF-OPS-30"}),
]


@pytest.mark.parametrize(
    ("status", "expected"), STATUS_CASES, ids=[nfs4.nfsstat4(c[0]).name for c in STATUS_CASES]
)
async def test_one_wrong_error_fails_exactly_its_checks(
    tmp_path: Path, status: int, expected: set[str]
) -> None:
    outcomes = await run_all(tmp_path, "tcp", replaces(status))
    assert failing(outcomes) == expected


def _getfh_without_lookup(ok: Any, a: nfs4.COMPOUND4args) -> bool:
    made = (nfs4.OP_LOOKUP, nfs4.OP_OPEN, nfs4.OP_CREATE)
    if any(x.argop in made for x in a.argarray):
        return False
    return _set(ok, "object", bytes(ok.object) + b"\0")


FIELD_CASES: list[tuple[str, Mutation, set[str]]] = [
    (
        "GETFH after PUTFH or RESTOREFH differs",
        field_mutation(nfs4.OP_GETFH, _getfh_without_lookup),
        {"CONF-OPS-34", "CONF-OPS-46"},
    ),
    (
        "TEST_STATEID finds every stateid valid",
        field_mutation(
            nfs4.OP_TEST_STATEID,
            lambda ok, a: _set(ok, "tsr_status_codes", [0] * len(ok.tsr_status_codes)),
        ),
        {"CONF-OPS-40"},
    ),
    (
        "ACCESS grants a bit it does not support",
        field_mutation(nfs4.OP_ACCESS, lambda ok, a: _set(ok, "access", ok.access | 0x80000)),
        {"CONF-OPS-44"},
    ),
    (
        "sr_highest_slotid beyond the table",
        field_mutation(nfs4.OP_SEQUENCE, lambda ok, a: _set(ok, "sr_highest_slotid", 1000)),
        {"SS-6.7"},
    ),
]


@pytest.mark.parametrize(
    ("why", "mutation", "expected"), FIELD_CASES, ids=[c[0] for c in FIELD_CASES]
)
async def test_one_wrong_field_fails_exactly_its_checks(
    tmp_path: Path, why: str, mutation: Mutation, expected: set[str]
) -> None:
    outcomes = await run_all(tmp_path, "tcp", mutation)
    assert failing(outcomes) == expected


# -- RPC-over-RDMA: reply mutations (the DDP checks see the data) ------------------------------
READLINK_ALTERED = field_mutation(
    nfs4.OP_READLINK, lambda ok, a: _set(ok, "link", bytes(ok.link) + b"x")
)
READ_EOF_INVERTED = field_mutation(nfs4.OP_READ, lambda ok, a: _set(ok, "eof", not ok.eof))
READDIR_SHORT = field_mutation(
    nfs4.OP_READDIR,
    lambda ok, a: bool(ok.reply.entries) and _set(ok.reply, "entries", ok.reply.entries[:-1]),
)
# The RPC-over-RDMA groups, and the operations that read data back.
RDMA_GROUPS = ["rfc8166", "rfc8267", "rfc8797", "rfc8167", "CONF-OPS-*"]

RDMA_MUTATIONS: list[tuple[str, Mutation, set[str]]] = [
    (
        "READ data corrupted",
        read_corrupted,
        {"CONF-OPS-3", "CONF-OPS-13", "CONF-OPS-18", "CONF-OPS-43", "CONF-OPS-45"}
        | {"UL-13.1", "UL-14.1", "UL-15.1"},
    ),
    (
        "READ eof inverted",
        READ_EOF_INVERTED,
        {"CONF-OPS-3", "CONF-OPS-4", "CONF-OPS-13", "CONF-OPS-43", "UL-14.1", "UL-14.2"},
    ),
    ("READDIR loses the last entry", READDIR_SHORT, {"CONF-OPS-5", "PD-7.1", "PD-9.1", "TR-10.1"}),
    ("READLINK text altered", READLINK_ALTERED, {"CONF-OPS-15", "UL-16.1", "UL-16.2"}),
]


@pytest.mark.parametrize(
    ("why", "mutation", "expected"), RDMA_MUTATIONS, ids=[c[0] for c in RDMA_MUTATIONS]
)
async def test_rdma_reply_mutation_fails_exactly_its_checks(
    tmp_path: Path, why: str, mutation: Mutation, expected: set[str]
) -> None:
    checks = select(all_checks(), RDMA_GROUPS, None)
    async with served(tmp_path, "rdma", mutation) as (h, server):
        outcomes = await run_checks(h, checks, limit=30)
        assert getattr(server, "mutated", 0) > 0
    assert failing(outcomes) == expected


# -- RPC-over-RDMA: the responder's transport broken for one rule -----------------------------
def _is_rdma_error(pieces: list[Any]) -> bool:
    head = bytes(pieces[0][:16]) if pieces else b""
    return len(head) == 16 and struct.unpack(">I", head[12:16])[0] == hdr.RDMA_ERROR


def never_sends_rdma_error(conn: Any) -> None:
    """A responder that answers nothing it cannot process (no RDMA_ERROR at all)."""
    send = conn._send

    def _send(pieces: list[Any], *args: Any, **kw: Any) -> None:
        if not _is_rdma_error(pieces):
            send(pieces, *args, **kw)

    conn._send = _send


def err_vers_says_version_1(conn: Any) -> None:
    """ERR_VERS whose header carries version 1, not the failing call's (RFC 8166 4.5)."""
    bad_header = conn._bad_header

    def _bad_header(e: Any) -> None:
        e.vers = hdr.VERSION
        bad_header(e)

    conn._bad_header = _bad_header


def refuses_long_calls(conn: Any) -> None:
    """RDMA_NOMSG calls (the message in a position-zero Read chunk) draw ERR_CHUNK."""
    on_call = conn._on_call

    def _on_call(h: Any, inline: Any, *rest: Any) -> None:
        if h.proc == hdr.RDMA_NOMSG:
            conn._send([hdr.encode_error(h.xid, conn.policy.grant, hdr.ERR_CHUNK)])
            return
        on_call(h, inline, *rest)

    conn._on_call = _on_call


def grants_zero_credits(conn: Any) -> None:
    conn.policy = dataclasses.replace(conn.policy, grant=0)


def ignores_client_receive_size(conn: Any) -> None:
    """Sends as much inline as its own Send Size allows, whatever the client can receive."""
    t = conn.thresholds
    conn.thresholds = dataclasses.replace(t, server_to_client=conn.local_pd.send_size)


def advertises_more_than_it_receives(conn: Any) -> None:
    """Advertises a 16 KiB Receive Size with 4 KiB receive buffers (PD-6)."""
    conn.local_pd = dataclasses.replace(conn.local_pd, receive_size=16 << 10)


def invalidates_regardless(conn: Any) -> None:
    """Sends with Invalidate (the first STag of the call) though the client's R bit is clear."""
    conn._invalidate_for = lambda h: min(h.rkeys()) if h.rkeys() else None


def reserved_bits_set(conn: Any) -> None:
    """Its private data has reserved bits set in octet 5."""
    private_data = conn.private_data

    def _private_data(*, accept: bool) -> bytes:
        raw = bytearray(private_data(accept=accept))
        raw[5] |= 0x80
        return bytes(raw)

    conn.private_data = _private_data


def ignores_null(conn: Any) -> None:
    """An RPC NULL call (procedure 0: a keepalive probe) with no chunks gets no answer."""
    on_call = conn._on_call

    def _on_call(h: Any, inline: Any, *rest: Any) -> None:
        plain = h.proc == hdr.RDMA_MSG and not (h.reads or h.writes or h.reply)
        if plain and len(inline) >= 24 and bytes(inline[20:24]) == bytes(4):
            return
        on_call(h, inline, *rest)

    conn._on_call = _on_call


def callbacks_offer_reply_chunk(conn: Any) -> None:
    """Backward calls carry a Reply chunk (a server exposing memory; RFC 8267 6.5.2 has them
    Short messages)."""
    send = conn._send

    def _send(pieces: list[Any], *args: Any, **kw: Any) -> None:
        flat = b"".join(bytes(p) for p in pieces)
        proc = struct.unpack_from(">I", flat, 12)[0] if len(flat) >= 28 else None
        if proc == hdr.RDMA_MSG and flat[16:28] == bytes(12) and flat[28 + 4 : 32 + 4] == bytes(4):
            reply = struct.pack(">IIIIQ", 1, 1, 0x1234, 512, 0x1000)
            flat = flat[:24] + reply + flat[28:]
            pieces = [flat]
        send(pieces, *args, **kw)

    conn._send = _send


RDMA_FAULTS: list[tuple[str, RdmaFault, set[str]]] = [
    (
        "no RDMA_ERROR ever",
        never_sends_rdma_error,
        {c.id for c in all_checks() if c.id.startswith(("TR-3.", "TR-4.", "TR-17."))}
        | {"UL-7.1", "UL-7.2"},
    ),
    ("ERR_VERS with rdma_vers 1", err_vers_says_version_1, {"TR-3.3"}),
    # With 1024-byte thresholds (PD-9.1) a session's calls are Long.
    ("long calls refused", refuses_long_calls, {"TR-9.1", "PD-9.1"}),
    ("grants zero credits", grants_zero_credits, {"TR-14.1", "TR-14.2", "TR-14.3"}),
    ("Receive Size ignored", ignores_client_receive_size, {"PD-9.1"}),
    ("advertises more than it receives", advertises_more_than_it_receives, {"PD-7.2"}),
    # Our requester's regions cannot be invalidated remotely: the connection fails at once,
    # so every check whose calls offer chunks fails (PD-15.1 among them).
    (
        "Send with Invalidate regardless",
        invalidates_regardless,
        {"UL-13.1", "UL-14.1", "UL-14.2", "UL-15.1", "UL-16.1", "UL-16.2", "UL-7.1", "UL-7.2"}
        | {"TR-10.1", "TR-9.1", "PD-7.1", "PD-9.1", "PD-7.2", "PD-15.1", "TR-14.3", "TR-19.1"}
        | {"CB-1"},
    ),
    ("reserved private-data bits set", reserved_bits_set, {"PD-2.1"}),
    ("callbacks with a Reply chunk", callbacks_offer_reply_chunk, {"CB-1"}),
    ("NULL ignored", ignores_null, {"TR-3.2", "TR-14.1", "TR-14.2", "TR-19.1"}),
]


@pytest.mark.parametrize(("why", "fault", "expected"), RDMA_FAULTS, ids=[c[0] for c in RDMA_FAULTS])
async def test_a_responder_fault_fails_exactly_its_checks(
    tmp_path: Path, why: str, fault: RdmaFault, expected: set[str]
) -> None:
    checks = [c for c in all_checks() if c.transports == ("rdma",)]
    async with served(tmp_path, "rdma", rdma_fault=fault, timeout=1.0) as (h, _):
        outcomes = await run_checks(h, checks, limit=30)
    assert failing(outcomes) == expected


def test_every_new_check_is_made_to_fail() -> None:
    from .test_harness import (
        CASES,
        RDMA_CASES,
        STATEFUL_CASES,
    )
    from .test_harness import FIELD_CASES as OLD_FIELD_CASES
    from .test_harness import STATUS_CASES as OLD_STATUS_CASES

    broken: set[str] = set()
    for cases in (CASES, OLD_FIELD_CASES, STATEFUL_CASES, RDMA_CASES, FIELD_CASES):
        for case in cases:
            broken |= case[-1]
    for _, ids in OLD_STATUS_CASES + STATUS_CASES:
        broken |= ids
    for _, _, ids in RDMA_MUTATIONS + RDMA_FAULTS:
        broken |= ids
    assert {c.id for c in all_checks()} - broken == set()
    assert len(all_checks()) >= 120


ReplayDiffers  # noqa: B018  (the false-retry check fails under it: test_harness.CASES)
