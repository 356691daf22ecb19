"""The COMPOUND fast paths (SEQUENCE + PUTFH + READ / WRITE / GETATTR / ACCESS / LOOKUP) answer
exactly as the generic path does: two servers built alike, one with the fast paths and one
without, get the same random requests (valid or not, truncated or not) in the same order, and
every reply must be the same, byte for byte. The two share one export directory (so file
handles and attributes agree) and are given the same source of randomness (session ids,
stateids, the write verifier)."""

from __future__ import annotations

import asyncio
import random
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4 import compound as compound_module
from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.inprocess import CompoundDriver, argop, compound_call, local_state
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import AUTH_NONE_CRED, auth_sys
from nfsrdma.session.server import SequenceResult, ServerSessions
from nfsrdma.vfs.base import Vfs
from nfsrdma.vfs.exports import parse
from nfsrdma.vfs.namespace import NamespaceVfs
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, XdrError, unpack

CRED = auth_sys(0, 0, (), "client-host")
CREDS = {"sys": CRED, "none": AUTH_NONE_CRED}
OK = nfs4.NFS4_OK
ANON = nfs4.stateid4(0, bytes(12))
PEER = "192.0.2.7:801"
# The security policies a server may have: none, the server's own flavours (``--sec sys``),
# an exports file whose rule for the export says ``sec=sys``. Under either of the last two,
# AUTH_NONE requests are refused NFS4ERR_WRONGSEC where the flavour rules say.
POLICIES = ("none", "server sec=sys", "export sec=sys")
_op = argop


def _vfs(root: Path, policy: str) -> Vfs | None:
    if policy != "export sec=sys":
        return None
    table = parse(f"{root / 'export'} *(rw,insecure,no_root_squash,sec=sys)\n")
    vfs = NamespaceVfs(table, state_dir=str(root / "state"))
    vfs._started_ns = 10**18  # the pseudo directories' times: the same on both servers
    return vfs


class Server:
    def __init__(self, root: Path, fast: bool, policy: str = "none") -> None:
        self.fast = fast
        cfg = ServerConfig(lease_time=60, slots=4, max_response_size_cached=2048)
        self.state = local_state(
            root,
            config=cfg,
            vfs=_vfs(root, policy),
            random_bytes=random.Random(7).randbytes,
            instance=b"inst",
        )
        self.state.vfs.write_verifier = b"verifier"
        if policy == "server sec=sys":
            self.state.security = (nfs4.AUTH_SYS,)
        self.driver = CompoundDriver(self.state, PEER)
        # The last reply's DDP items, as (offset, length, tag): where their data goes, and
        # which READ each belongs to (the transport places it by that), beside the bytes.
        self.ddp: list[tuple[int, int, int]] = []

    async def send(self, data: bytes) -> bytes:
        saved = compound_module.FAST_PATHS
        compound_module.FAST_PATHS = self.fast
        self.ddp = []
        try:
            out = await self.driver.send(data)
        except XdrError:
            return b"GARBAGE_ARGS"
        finally:
            compound_module.FAST_PATHS = saved
        self.ddp = [(i.offset, len(i.data), i.tag) for i in out.ddp]
        return bytes(out.flatten())

    def close(self) -> None:
        self.state.vfs.release_identity()  # (AUTH_NONE requests took on the anonymous one)
        self.state.close()


@dataclass
class Pair:
    """The fast and the generic server, and what the requests need to know."""

    fast: Server
    generic: Server
    xid: int = 0
    sessionid: bytes = b""
    root_fh: bytes = b""  # the export's root (below the pseudo-root where there is one)
    pseudo_fh: bytes = b""  # PUTROOTFH's
    file_fh: bytes = b""
    stateid: nfs4.stateid4 = field(default_factory=lambda: ANON)
    seqids: list[int] = field(default_factory=list)

    def encode(self, ops: list[nfs4.nfs_argop4], cut: int = 0, auth: str = "sys") -> bytes:
        self.xid += 1
        data = compound_call(self.xid, ops, CREDS[auth])
        return data[: len(data) - cut] if cut else data

    def close(self) -> None:
        self.fast.close()
        self.generic.close()

    async def both(self, data: bytes) -> bytes:
        fast = await self.fast.send(data)
        generic = await self.generic.send(data)
        assert fast == generic, _explain(data, fast, generic)
        assert self.fast.ddp == self.generic.ddp, _explain(data, fast, generic)
        return fast

    async def ok(self, ops: list[nfs4.nfs_argop4]) -> nfs4.COMPOUND4res:
        """Set-up steps: run on both and checked to succeed on both."""
        request = self.encode(ops)
        data = await self.fast.send(request)
        res = unpack(nfs4.dec_COMPOUND4res, data)
        other = unpack(nfs4.dec_COMPOUND4res, await self.generic.send(request))
        assert other.status == res.status and len(other.resarray) == len(res.resarray)
        assert res.status == OK, nfs4.nfsstat4(res.status).name
        return res

    async def setup(self, below: Path | None = None, cached: int = 2048) -> None:
        """A session on each; ``below``: the export's path under the pseudo-root, if any;
        ``cached``: the fore channel's ca_maxresponsesize_cached."""
        fore = nfs4.channel_attrs4(0, 1049620, 1049480, cached, 8, 4, [])
        for server in (self.fast, self.generic):
            self.pseudo_fh = await server.driver.mount(b"prop client", fore, cb_program=0)
        assert self.fast.driver.sessionid == self.generic.driver.sessionid
        self.sessionid = self.fast.driver.sessionid
        self.seqids = [self.fast.driver.seqid, 0, 0, 0]
        self.root_fh = self.pseudo_fh
        if below is not None:
            steps = [_op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(p.encode())) for p in below.parts[1:]]
            res = await self.ok(
                [self.seq(0, 1), _op(nfs4.OP_PUTROOTFH), *steps, _op(nfs4.OP_GETFH)]
            )
            self.root_fh = res.resarray[-1].value.value.object
        opened = await self.ok(
            [
                self.seq(0, 1),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(self.root_fh)),
                _op(
                    nfs4.OP_OPEN,
                    nfs4.OPEN4args(
                        0,
                        nfs4.OPEN4_SHARE_ACCESS_BOTH,
                        nfs4.OPEN4_SHARE_DENY_NONE,
                        nfs4.open_owner4(1, b"prop"),
                        nfs4.openflag4(nfs4.OPEN4_NOCREATE, None),
                        nfs4.open_claim4(nfs4.CLAIM_NULL, b"f"),
                    ),
                ),
                _op(nfs4.OP_GETFH),
            ]
        )
        self.stateid = opened.resarray[2].value.value.stateid
        self.file_fh = opened.resarray[3].value.value.object

    def seq(self, slot: int, delta: int, cachethis: bool = False) -> nfs4.nfs_argop4:
        last = self.seqids[slot] if slot < len(self.seqids) else 0
        seqid = (last + delta) & 0xFFFFFFFF
        if delta == 1 and slot < len(self.seqids):
            self.seqids[slot] = seqid
        args = nfs4.SEQUENCE4args(self.sessionid, seqid, slot, 3, cachethis)
        return _op(nfs4.OP_SEQUENCE, args)


# -- random requests ------------------------------------------------------------------------
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.one_of(
    st.sampled_from([0, 1, 4096, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]),
    st.integers(0, (1 << 64) - 1),
)
count = st.one_of(st.sampled_from([0, 1, 100, 4096, 5000, 1 << 20]), u32)
stateid_kind = st.sampled_from(["open", "anon", "random", "bypass"])
fh_kind = st.sampled_from(["file", "root", "pseudo", "random", "empty"])
name = st.one_of(
    st.sampled_from([b"f", b"missing", b".", b"..", b"", b"a/b"]), st.binary(max_size=20)
)
# The file system's free space and free files move with every other writer on the host's disk
# between the two servers' replies: the bitmaps ask for anything but those.
_LIVE_COUNTERS = bitmap_of(
    [
        nfs4.FATTR4_FILES_AVAIL,
        nfs4.FATTR4_FILES_FREE,
        nfs4.FATTR4_SPACE_AVAIL,
        nfs4.FATTR4_SPACE_FREE,
    ]
)


def _without_live_counters(words: list[int]) -> list[int]:
    return [w & ~(_LIVE_COUNTERS[i] if i < len(_LIVE_COUNTERS) else 0) for i, w in enumerate(words)]


# (the fast path reads up to 4 words itself)
bitmap = st.lists(u32, max_size=6).map(_without_live_counters)


@st.composite
def third_op(draw: st.DrawFn) -> tuple[str, object]:
    kind = draw(
        st.sampled_from(
            [
                "READ",
                "WRITE",
                "GETATTR",
                "ACCESS",
                "LOOKUP",
                "GETFH",
                "SECINFO_NO_NAME",
                "OPEN",
                "CLOSE",
                "SEQUENCE",
            ]
        )
    )
    if kind == "READ":
        return kind, (draw(stateid_kind), draw(u64), draw(count))
    if kind == "WRITE":
        return kind, (
            draw(stateid_kind),
            draw(st.integers(0, 10000) | u64),
            draw(st.integers(0, 2)),
            draw(st.binary(max_size=300)),
        )
    if kind == "GETATTR":
        return kind, draw(st.one_of(st.just("linux"), bitmap))
    if kind == "ACCESS":
        return kind, draw(u32)
    if kind == "LOOKUP":
        return kind, draw(name)
    if kind == "SECINFO_NO_NAME":
        return kind, draw(st.integers(0, 2))
    if kind == "OPEN":  # the open file or a random name, read or write access, two owners
        return kind, (draw(st.one_of(st.just(b"f"), name)), draw(st.integers(1, 2)))
    if kind == "CLOSE":
        return kind, draw(stateid_kind)
    return kind, None


@st.composite
def compounds(draw: st.DrawFn) -> dict[str, object]:
    return {
        "slot": draw(st.sampled_from([0, 0, 1, 3, 9])),
        "delta": draw(st.sampled_from([1, 1, 1, 0, 2])),
        "cachethis": draw(st.booleans()),
        "fh": draw(fh_kind),
        "third": draw(third_op()),
        "extra": draw(
            st.sampled_from([None, None, "GETFH", "GETATTR", "SEQUENCE", "SECINFO_NO_NAME"])
        ),
        "cut": draw(st.sampled_from([0, 0, 0, 0, 1, 4, 9, 30])),
        "auth": draw(st.sampled_from(["sys", "sys", "none"])),
        # SEQUENCE's arguments as the fast path reads them (one struct call, RFC 8881 18.46):
        # an unknown session, other sa_highest_slotid values, sa_cachethis not an XDR bool
        "seqargs": draw(
            st.sampled_from(
                ["", "", "", "", "badsession", "highest0", "highest9", "highestmax", "bool2"]
            )
        ),
    }


LINUX_BITMAP = bitmap_of(
    [
        nfs4.FATTR4_TYPE,
        nfs4.FATTR4_CHANGE,
        nfs4.FATTR4_SIZE,
        nfs4.FATTR4_FILEID,
        nfs4.FATTR4_MODE,
        nfs4.FATTR4_OWNER,
        nfs4.FATTR4_TIME_MODIFY,
    ]
)


def _plain(
    third: tuple[str, object], *, extra: object = None, cachethis: bool = False
) -> dict[str, object]:
    """A well-formed case of ``compounds``: slot 0, the next seqid, the file's handle,
    ``third`` (and ``extra``) after SEQUENCE and PUTFH, nothing cut."""
    return {
        "slot": 0,
        "delta": 1,
        "cachethis": cachethis,
        "fh": "file",
        "third": third,
        "extra": extra,
        "cut": 0,
    }


def build(pair: Pair, c: dict[str, object], rand_fh: bytes, rand_sid: bytes) -> bytes:
    sid = {
        "open": pair.stateid,
        "anon": ANON,
        "random": nfs4.stateid4(1, rand_sid),
        "bypass": nfs4.stateid4(0xFFFFFFFF, b"\xff" * 12),
    }
    fh = {
        "file": pair.file_fh,
        "root": pair.root_fh,
        "pseudo": pair.pseudo_fh,
        "random": rand_fh,
        "empty": b"",
    }[str(c["fh"])]
    first = pair.seq(int(c["slot"]), int(c["delta"]), bool(c["cachethis"]))
    seqargs, seq_args = str(c.get("seqargs", "")), first.value
    assert isinstance(seq_args, nfs4.SEQUENCE4args)
    if seqargs == "badsession":
        seq_args.sa_sessionid = bytes(16)
    elif seqargs.startswith("highest"):
        seq_args.sa_highest_slotid = {"0": 0, "9": 9, "max": 0xFFFFFFFF}[seqargs[7:]]
    ops = [first, _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))]  # type: ignore[call-overload]
    kind, a = c["third"]  # type: ignore[misc]
    if kind == "READ":
        ops.append(_op(nfs4.OP_READ, nfs4.READ4args(sid[a[0]], a[1], a[2])))
    elif kind == "WRITE":
        ops.append(
            _op(nfs4.OP_WRITE, nfs4.WRITE4args(sid[a[0]], a[1], nfs4.stable_how4(a[2]), a[3]))
        )
    elif kind == "GETATTR":
        ops.append(_op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP if a == "linux" else a)))
    elif kind == "ACCESS":
        ops.append(_op(nfs4.OP_ACCESS, nfs4.ACCESS4args(a)))
    elif kind == "LOOKUP":
        ops.append(_op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(a)))
    elif kind == "SECINFO_NO_NAME":  # a style of 2 (none such) is written over a 1 below
        ops.append(_op(nfs4.OP_SECINFO_NO_NAME, nfs4.secinfo_style4(min(int(a), 1))))
    elif kind == "OPEN":
        file, access = a
        args = nfs4.OPEN4args(
            0,
            access,
            nfs4.OPEN4_SHARE_DENY_NONE,
            nfs4.open_owner4(1, b"prop-%d" % access),
            nfs4.openflag4(nfs4.OPEN4_NOCREATE, None),
            nfs4.open_claim4(nfs4.CLAIM_NULL, file),
        )
        ops.append(_op(nfs4.OP_OPEN, args))
    elif kind == "CLOSE":
        ops.append(_op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, sid[a])))
    elif kind == "SEQUENCE":
        ops.append(pair.seq(0, 0))
    else:
        ops.append(_op(nfs4.OP_GETFH))
    extra = c["extra"]
    if kind == "WRITE" and extra == "GETATTR":
        # The two servers write one file, one after the other: its times after each one's
        # WRITE differ (in later COMPOUNDs both see the second).
        extra = "GETFH"
    if extra == "GETFH":
        ops.append(_op(nfs4.OP_GETFH))
    elif extra == "GETATTR":
        ops.append(_op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)))
    elif extra == "SEQUENCE":
        ops.append(pair.seq(0, 0))
    elif extra == "SECINFO_NO_NAME":
        ops.append(_op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH))
    data = pair.encode(ops, 0, str(c.get("auth", "sys")))  # type: ignore[call-overload]
    if kind == "SECINFO_NO_NAME" and a == 2:
        # The enum (a native class's field in the compiled build) has no 2: on the wire only.
        at = data.index(struct.pack(">II", nfs4.OP_SECINFO_NO_NAME, 1)) + 4
        data = data[:at] + (2).to_bytes(4, "big") + data[at + 4 :]
    if seqargs == "bool2":  # sa_cachethis, the last word of the first SEQUENCE's arguments
        at = data.index(seq_args.sa_sessionid) + 28
        data = data[:at] + (2).to_bytes(4, "big") + data[at + 4 :]
    cut = int(c["cut"])
    return data[: len(data) - cut] if cut else data


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(compounds(), st.binary(max_size=70), st.binary(min_size=12, max_size=12)),
        min_size=1,
        max_size=8,
    )
)
def test_fast_paths_reply_byte_for_byte_as_the_generic_path(
    policy: str, steps: list[tuple[dict[str, object], bytes, bytes]]
) -> None:
    """... with no security policy, with the server's flavours and with an export's."""

    async def scenario(root: Path) -> int:
        (root / "export").mkdir()
        # Made here, not by an OPEN: a server keeps its own count of the changes it made.
        (root / "export" / "f").write_bytes(bytes(range(256)) * 20)
        pair = Pair(Server(root, True, policy), Server(root, False, policy))
        try:
            await pair.setup(root / "export" if policy == "export sec=sys" else None)
            fast_taken = 0
            for c, rand_fh, rand_sid in steps:
                data = build(pair, c, rand_fh, rand_sid)
                fast_taken += compound_module.FAST_PATHS and _is_fast(data)
                await pair.both(data)
            return fast_taken
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


def _explain(data: bytes, fast: bytes, generic: bytes) -> str:
    def show(b: bytes) -> object:
        try:
            return unpack(nfs4.dec_COMPOUND4res, b)
        except XdrError:
            return b

    r = Reader(data)
    _, _, off = message.decode_call(r)
    try:
        req: object = nfs4.dec_COMPOUND4args(r, off)[0]
    except XdrError:
        req = data
    return f"request {req}\nfast    {show(fast)}\ngeneric {show(generic)}"


def _is_fast(data: bytes) -> bool:
    r = Reader(data)
    _, _, off = message.decode_call(r)
    try:
        head, off = nfs4.peek_COMPOUND4args(r, off)
    except XdrError:
        return False
    return compound_module._fast_steps(r, off, head.argarray) is not None


@pytest.mark.parametrize(
    "third", ["READ", "WRITE", "GETATTR", "ACCESS", "LOOKUP", "OPEN", "CLOSE", "GETFH"]
)
def test_the_linux_shapes_take_the_fast_path(third: str) -> None:
    """The property above compares something: these requests do take the fast path."""
    pair = Pair(Server.__new__(Server), Server.__new__(Server))
    pair.sessionid, pair.seqids, pair.file_fh, pair.root_fh = (
        bytes(16),
        [0, 0, 0, 0],
        b"fh",
        b"root",
    )
    args = {
        "READ": ("open", 0, 4096),
        "WRITE": ("open", 0, 2, b"x"),
        "GETATTR": "linux",
        "ACCESS": 63,
        "LOOKUP": b"f",
        "OPEN": (b"f", 1),
        "CLOSE": "open",
        "GETFH": None,
    }
    c = _plain((third, args[third]))
    assert _is_fast(build(pair, c, b"", bytes(12)))
    c["fh"], c["third"] = "root", ("SEQUENCE", None)  # out of place: the generic path says so
    assert not _is_fast(build(pair, c, b"", bytes(12)))


@pytest.mark.parametrize("third", ["READ", "GETATTR", "ACCESS"])
def test_an_export_with_flavours_refuses_auth_sys_on_the_fast_shapes_too(third: str) -> None:
    """With flavours configured (``--sec``), PUTFH followed by an operation that is not a
    look-up is refused NFS4ERR_WRONGSEC to an AUTH_SYS request (RFC 8881 2.6.3.1.1.5): the
    fast path must not skip that check."""

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        (root / "export" / "f").write_bytes(b"data")
        pair = Pair(Server(root, fast=True), Server(root, fast=False))
        try:
            await pair.setup()
            krb5 = 390003
            pair.fast.state.security = pair.generic.state.security = (krb5,)
            args = {"READ": ("open", 0, 4), "GETATTR": "linux", "ACCESS": 63}[third]
            c = _plain((third, args))
            reply = await pair.both(build(pair, c, b"", bytes(12)))
            res = unpack(nfs4.dec_COMPOUND4res, reply)
            assert res.status == nfs4.NFS4ERR_WRONGSEC
            assert [r.resop for r in res.resarray] == [nfs4.OP_SEQUENCE, nfs4.OP_PUTFH]
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


def test_read_data_counts_toward_the_cached_reply_limit() -> None:
    """READ data travels as a DDP item beside the reply's bytes: it counts toward
    ca_maxresponsesize_cached (2048 here), on both paths, and still when a GETATTR follows
    (the fast path's GETATTR writer counts the READ data before it)."""

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        (root / "export" / "f").write_bytes(bytes(range(256)) * 20)
        pair = Pair(Server(root, fast=True), Server(root, fast=False))
        try:
            await pair.setup()
            too_big = nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE
            for count, extra, status, results in (
                (1900, None, OK, 3),
                (2100, None, too_big, 3),
                (1600, "GETATTR", OK, 4),
                (1950, "GETATTR", too_big, 4),
            ):
                c = _plain(("READ", ("open", 0, count)), extra=extra, cachethis=True)
                res = unpack(nfs4.dec_COMPOUND4res, await pair.both(build(pair, c, b"", b"")))
                assert (res.status, len(res.resarray)) == (status, results)
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


@pytest.mark.parametrize(
    ("tag", "minor", "status"),
    [
        (b"", 1, nfs4.NFS4ERR_OP_NOT_IN_SESSION),
        (b"", 7, nfs4.NFS4ERR_MINOR_VERS_MISMATCH),
        (b"linux", 1, nfs4.NFS4ERR_OP_NOT_IN_SESSION),
        (b"\xff\xfe", 1, nfs4.NFS4ERR_INVAL),  # not UTF-8
        (b"\xff\xfe", 7, nfs4.NFS4ERR_MINOR_VERS_MISMATCH),  # the version is looked at first
    ],
)
def test_the_compound_header_untagged_or_tagged(tag: bytes, minor: int, status: int) -> None:
    """The untagged header (the Linux client's) is read without the generic decoder; both
    kinds give the reply the generic decoder's would: the tag echoed, the version and the
    tag's UTF-8 checked in that order, and a truncated header is GARBAGE_ARGS."""

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        server = Server(root, fast=True)
        try:
            data = compound_call(1, [_op(nfs4.OP_PUTROOTFH)], CRED, tag=tag, minor=minor)
            res = unpack(nfs4.dec_COMPOUND4res, await server.send(data))
            assert (res.status, res.tag) == (status, tag)
            valid = status == nfs4.NFS4ERR_OP_NOT_IN_SESSION  # (PUTROOTFH without SEQUENCE)
            assert len(res.resarray) == valid
            # COMPOUND4args: tag (length and padded octets), minorversion, count, one opnum
            head = 4 + len(tag) + (-len(tag) & 3) + 8
            start = len(data) - head - 4
            for end in range(start, start + head):  # the header cut short
                assert await server.send(data[:end]) == b"GARBAGE_ARGS", end - start
            cut = await server.send(data[: start + head])  # no room for its one operation
            assert (cut == b"GARBAGE_ARGS") == valid
        finally:
            server.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


# The flavour rules (RFC 8881 section 2.6.3.1.1; nfs4/ops/lookup.py FLAVOUR_RULES): a PUTFH of a
# directory of the export, then what follows, under AUTH_NONE, which both policies refuse.
# The statuses after SEQUENCE's: one rule for the server's flavours and the export's rule.
_GETATTR = nfs4.GETATTR4args(bitmap_of([nfs4.FATTR4_TYPE]))
_LOOKUP_F = _op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"f"))
_NO_NAME = _op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH)
_SAVEFH = _op(nfs4.OP_SAVEFH)
_SAVE_RESTORE = [_SAVEFH, _op(nfs4.OP_RESTOREFH)]
_OK, _WRONGSEC = "OK", "WRONGSEC"
RULE_CASES: dict[str, tuple[list[nfs4.nfs_argop4], list[str]]] = {
    "at the end": ([], [_OK]),
    "GETFH": ([_op(nfs4.OP_GETFH)], [_WRONGSEC]),
    "GETATTR": ([_op(nfs4.OP_GETATTR, _GETATTR)], [_WRONGSEC]),
    "VERIFY": ([_op(nfs4.OP_VERIFY, nfs4.VERIFY4args(nfs4.fattr4([], b"")))], [_WRONGSEC]),
    "NVERIFY": ([_op(nfs4.OP_NVERIFY, nfs4.NVERIFY4args(nfs4.fattr4([], b"")))], [_WRONGSEC]),
    "ACCESS": ([_op(nfs4.OP_ACCESS, nfs4.ACCESS4args(1))], [_WRONGSEC]),
    "READDIR": (
        [_op(nfs4.OP_READDIR, nfs4.READDIR4args(0, bytes(8), 4096, 4096, []))],
        [_WRONGSEC],
    ),
    "LOOKUP": ([_LOOKUP_F], [_OK, _WRONGSEC]),
    "LOOKUP, GETFH": ([_LOOKUP_F, _op(nfs4.OP_GETFH)], [_OK, _WRONGSEC]),
    "LOOKUPP": ([_op(nfs4.OP_LOOKUPP)], [_OK, _WRONGSEC]),
    "SECINFO": ([_op(nfs4.OP_SECINFO, nfs4.SECINFO4args(b"f"))], [_OK, _OK]),
    "SECINFO_NO_NAME": ([_NO_NAME], [_OK, _OK]),
    # SAVEFH is never refused, and PUTFH is judged as if it were not there (2.6.3.1.1.1).
    "SAVEFH": ([_SAVEFH], [_OK, _OK]),
    "SAVEFH, GETFH": ([_SAVEFH, _op(nfs4.OP_GETFH)], [_WRONGSEC]),
    "SAVEFH, LOOKUP": ([_SAVEFH, _LOOKUP_F], [_OK, _OK, _WRONGSEC]),
    "SAVEFH, SAVEFH, SECINFO_NO_NAME": ([_SAVEFH, _SAVEFH, _NO_NAME], [_OK] * 4),
    # Put-filehandle operations in a row: only the last is judged (2.6.3.1.1.2).
    "SAVEFH, RESTOREFH": (_SAVE_RESTORE, [_OK, _OK, _OK]),
    "SAVEFH, RESTOREFH, GETFH": ([*_SAVE_RESTORE, _op(nfs4.OP_GETFH)], [_OK, _OK, _WRONGSEC]),
    "SAVEFH, RESTOREFH, SECINFO_NO_NAME": ([*_SAVE_RESTORE, _NO_NAME], [_OK] * 4),
    "PUTROOTFH": ([_op(nfs4.OP_PUTROOTFH)], [_OK, _OK]),
}
# Where the two policies still answer differently, (server's flavours, export's rule): the
# root is the export's pseudo file system, which accepts every flavour; LOOKUP into an export
# is judged by the VFS, SECINFO_NO_NAME following or not (ops/lookup.py wrong_security).
POLICY_CASES: dict[str, tuple[list[nfs4.nfs_argop4], list[str], list[str]]] = {
    "PUTROOTFH, GETFH": (
        [_op(nfs4.OP_PUTROOTFH), _op(nfs4.OP_GETFH)],
        [_OK, _WRONGSEC],
        [_OK] * 3,
    ),
    "LOOKUP, SECINFO_NO_NAME": ([_LOOKUP_F, _NO_NAME], [_OK, _OK, _OK], [_OK, _WRONGSEC]),
}


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_the_flavour_rules_after_putfh_on_both_paths(policy: str) -> None:
    """PUTFH followed by each kind of operation (the table's roles, and operations outside
    it), at the end of the COMPOUND, and before SECINFO / SECINFO_NO_NAME: AUTH_NONE gets
    NFS4ERR_WRONGSEC where the rules say, at the same operation on the fast and the generic
    path; AUTH_SYS, which both policies list, never does."""

    async def scenario(root: Path) -> None:
        (root / "export" / "d").mkdir(parents=True)
        (root / "export" / "d" / "f").write_bytes(b"data")
        (root / "export" / "f").write_bytes(b"data")
        pair = Pair(Server(root, True, policy), Server(root, False, policy))
        try:
            await pair.setup(root / "export" if policy == "export sec=sys" else None)
            res = await pair.ok(
                [
                    pair.seq(0, 1),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(pair.root_fh)),
                    _op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"d")),
                    _op(nfs4.OP_GETFH),
                ]
            )
            put_d = _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(res.resarray[-1].value.value.object))
            cases = {k: (ops, want, want) for k, (ops, want) in RULE_CASES.items()}
            cases.update(POLICY_CASES)  # and a second PUTFH: only the last one counts
            cases["PUTFH, GETATTR"] = (
                [put_d, _op(nfs4.OP_GETATTR, _GETATTR)],
                [_OK, _WRONGSEC],
                [_OK, _WRONGSEC],
            )
            for case, (after, server_sec, export_sec) in cases.items():
                for auth in ("none", "sys"):
                    ops = [pair.seq(0, 1), put_d, *after]
                    reply = await pair.both(pair.encode(ops, auth=auth))
                    res = unpack(nfs4.dec_COMPOUND4res, reply)
                    got = [_short(r) for r in res.resarray[1:]]
                    if auth == "sys":
                        assert _WRONGSEC not in got, (case, got)
                    else:
                        want = server_sec if policy == "server sec=sys" else export_sec
                        assert got == want, case
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))


def _short(resop: nfs4.nfs_resop4) -> str:
    status = nfs4.nfsstat4(resop.value.status).name
    return "OK" if status == "NFS4_OK" else status.removeprefix("NFS4ERR_")


# The spies below replace methods of ``_Run`` and ``ServerSessions`` on the class: in the
# compiled build (the default) those are native classes whose callers call the methods
# directly, so a spy there sees nothing. Those tests run on the pure build only.
_SPIES_SEE_CALLS = pytest.mark.skipif(
    not str(compound_module.__file__).endswith(".py"),
    reason="compiled nfs4/compound.py: native methods cannot be spied on",
)


def _record_spy() -> tuple[list[int], Any]:
    """A stand-in for ``_Run._record`` that lists the operation numbers it records (to be
    set with monkeypatch once the session is set up), and that list."""
    recorded: list[int] = []
    generic_record = compound_module._Run._record

    def spy(run: compound_module._Run, op: object, res: object) -> bool:
        recorded.append(op.number)  # type: ignore[attr-defined]
        return generic_record(run, op, res)  # type: ignore[arg-type]

    return recorded, spy


@_SPIES_SEE_CALLS
@pytest.mark.parametrize("third", ["GETATTR", "GETFH", "READ"])
def test_a_fast_getattr_is_written_without_the_generic_encoder(
    monkeypatch: pytest.MonkeyPatch, third: str
) -> None:
    """The property above compares something for GETATTR's result writer
    (``_Run._getattr_ok``): on the fast path a successful GETATTR (third, or after another
    operation, as GETFH) never reaches ``_record``; on the generic path it does, and both
    replies are the same. Likewise READ's (``_Run._read_pack``), its data the same DDP
    item."""
    recorded, spy = _record_spy()

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        (root / "export" / "f").write_bytes(b"data")
        pair = Pair(Server(root, fast=True), Server(root, fast=False))
        try:
            await pair.setup()
            monkeypatch.setattr(compound_module._Run, "_record", spy)
            args = {"GETATTR": "linux", "GETFH": None, "READ": ("open", 0, 100)}[third]
            c = _plain((third, args), extra="GETATTR" if third == "GETFH" else None)
            reply = await pair.both(build(pair, c, b"", bytes(12)))
            assert unpack(nfs4.dec_COMPOUND4res, reply).status == OK
            assert len(pair.fast.ddp) == (third == "READ")
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))
    number = nfs4.OP_READ if third == "READ" else nfs4.OP_GETATTR
    assert recorded.count(number) == 1  # the generic server's only


@_SPIES_SEE_CALLS
@pytest.mark.parametrize("cachethis", [False, True])
@pytest.mark.parametrize("third", ["GETATTR", "READ"])
def test_a_fast_result_over_the_cached_reply_limit(
    monkeypatch: pytest.MonkeyPatch, third: str, cachethis: bool
) -> None:
    """A GETATTR or READ result that takes the reply past ca_maxresponsesize_cached (120
    here): NFS4ERR_REP_TOO_BIG_TO_CACHE when the client asked for it to be cached, as the
    generic path answers; within the limit otherwise, and then written by the operation's
    own writer (``_Run._getattr_pack``, ``_read_pack``), never reaching ``_record``: the
    cached limit bounds only replies to be cached (the Linux client's 4 KiB READs exceed its
    3428 without asking)."""
    recorded, spy = _record_spy()

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        (root / "export" / "f").write_bytes(bytes(range(200)))
        pair = Pair(Server(root, fast=True), Server(root, fast=False))
        try:
            await pair.setup(cached=120)
            monkeypatch.setattr(compound_module._Run, "_record", spy)
            args = "linux" if third == "GETATTR" else ("open", 0, 150)
            c = _plain((third, args), cachethis=cachethis)
            res = unpack(nfs4.dec_COMPOUND4res, await pair.both(build(pair, c, b"", bytes(12))))
            assert res.status == (nfs4.NFS4ERR_REP_TOO_BIG_TO_CACHE if cachethis else OK)
            assert [r.resop for r in res.resarray][-1] == getattr(nfs4, f"OP_{third}")
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))
    # the generic server's only, unless the limit sends the fast one to ``_record`` too
    assert recorded.count(getattr(nfs4, f"OP_{third}")) == (2 if cachethis else 1)


@_SPIES_SEE_CALLS
@pytest.mark.parametrize("third", ["READ", "GETATTR", "ACCESS"])
def test_a_fast_sequence_reads_its_arguments_in_place(
    monkeypatch: pytest.MonkeyPatch, third: str
) -> None:
    """The property above compares something for SEQUENCE on the fast path: its arguments
    read in place and the session table asked with their fields (``sequence_of``, not
    ``sequence`` with SEQUENCE4args), its success packed without ``_record``; the generic
    server goes through both, and the replies are the same (RFC 8881 section 18.46)."""
    recorded: list[int] = []
    asked: list[bytes] = []
    generic_record = compound_module._Run._record
    generic_sequence = ServerSessions.sequence

    def spy(run: compound_module._Run, op: object, res: object) -> bool:
        recorded.append(op.number)  # type: ignore[attr-defined]
        return generic_record(run, op, res)  # type: ignore[arg-type]

    def spy_sequence(
        sessions: ServerSessions, args: nfs4.SEQUENCE4args, **kw: Any
    ) -> SequenceResult:
        asked.append(args.sa_sessionid)
        return generic_sequence(sessions, args, **kw)

    async def scenario(root: Path) -> None:
        (root / "export").mkdir()
        (root / "export" / "f").write_bytes(b"data")
        pair = Pair(Server(root, fast=True), Server(root, fast=False))
        try:
            await pair.setup()
            monkeypatch.setattr(compound_module._Run, "_record", spy)
            monkeypatch.setattr(ServerSessions, "sequence", spy_sequence)
            args = {"READ": ("open", 0, 100), "GETATTR": "linux", "ACCESS": 63}[third]
            c = _plain((third, args))
            reply = await pair.both(build(pair, c, b"", bytes(12)))
            assert unpack(nfs4.dec_COMPOUND4res, reply).status == OK
        finally:
            pair.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp)))
    assert recorded.count(nfs4.OP_SEQUENCE) == 1  # the generic server's only
    assert len(asked) == 1
