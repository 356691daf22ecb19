"""Fuzz campaign: seeded, mutated input through the real code paths, counting crashes, hangs,
wrong-XID replies and RSS growth (issue 9, "Reliability figures").

1. COMPOUNDs: valid NFSv4.1 calls (SEQUENCE on a real session, then namespace, open, I/O and
   lock operations on a scratch export) built with the generated codec, then mutated (bit
   flips, byte and word overwrites with interesting values, truncation, splices from other
   calls, operation codes, counts and lengths). They go into ``NFSServer``'s own connection
   handler through ``TcpConnection.data_received`` (record marking → RPC dispatch → COMPOUND →
   operations → VFS), the same code a socket feeds; one in ``--tcp-every`` goes through a real
   loopback socket with random fragmenting and, half of the time, a mutated record mark.
2. RPC-over-RDMA headers: valid headers with random chunk lists, mutated, then ``header.parse``,
   ``header.check_call`` and the responder's chunk planning ``marshal.plan_reply``.
3. RFC 8797 private data: mutated and random blobs into ``privdata.decode`` and the threshold
   negotiation.
4. Callbacks into our client: mutated CB_COMPOUND calls (CB_SEQUENCE on the live back channel,
   CB_RECALL, CB_NOTIFY_LOCK, CB_RECALL_SLOT, CB_RECALL_ANY, ...) through a connected client's
   own RPC dispatcher and back-channel handler.

A crash is an exception escaping a parser other than its documented error type, an error the
server or client logs with a traceback (SYSTEM_ERR, NFS4ERR_SERVERFAULT), or an exception
reaching the event loop. A hang is a call that should be answered (at least 8 bytes, message
type CALL) with no reply within ``--hang-bound`` seconds; a wrong-XID reply is a reply whose
XID matches no call in flight. Seeded: with the same ``--seed`` the header and private-data
inputs are the same bytes, and the COMPOUND and CB_COMPOUND campaigns draw the same templates
and mutations (values the server hands out — session ids, handles, stateids — and the order
in which socket exchanges interleave differ between runs; a crash is reported with its bytes).

Last line: ``compounds=… headers=… privdata=… cb=… crashes=… hangs=… wrong_xid=…
rss_start_mib=… rss_max_mib=… rss_end_mib=…``. Defaults are the targets (10**6 COMPOUNDs,
10**6 headers, 10**5 private-data blobs); pass smaller counts for a quick run. With
``--check`` the exit status is 1 when a target is missed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from reliability import Crash, ErrorCatcher, report_crashes, rss_kib, step

import nfsrdma
from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.server import NFSServer
from nfsrdma.transport.rdma import header as rh
from nfsrdma.transport.rdma import marshal, privdata
from nfsrdma.transport.tcp import LAST_FRAGMENT, RecordParser, TcpConnection
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import DdpItem, Reader, Writer, XdrError, pack

U32 = struct.Struct(">I")
INTERESTING = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    53,
    64,
    255,
    256,
    1024,
    4096,
    0xFFFF,
    0x10000,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFE,
    0xFFFFFFFF,
    10044,
]
NAMES = [b"a", b"b", b"c", b"d", b"sub", b"f1", b"f2", b"..", b".", b"x" * 300, b"a/b", b""]
ATTRS = [[0x0010011A, 0x00B0A23A], [0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], [], [1 << 1]]


@dataclass
class Figures:
    inputs: int = 0
    replies: int = 0
    hangs: int = 0
    wrong_xid: int = 0
    refused: int = 0  # documented errors (HeaderError, XdrError, ...)
    seconds: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)


class Rss:
    """RSS of this process (the server runs in it): start, largest, end."""

    def __init__(self) -> None:
        self.start = self.max = self.end = rss_kib()

    def sample(self) -> int:
        self.end = rss_kib()
        self.max = max(self.max, self.end)
        return self.end


def mutate(rng: random.Random, data: bytes, donors: list[bytes], marks: list[int]) -> bytes:
    """One to four mutations of ``data``; ``marks`` are offsets worth aiming at (the XID, the
    operation count, operation codes), ``donors`` other valid messages to splice from."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(10)
        n = len(b)
        if n < 4:
            b += rng.randbytes(rng.randint(1, 8))
            continue
        aimed = rng.choice(marks) if marks and rng.random() < 0.5 else rng.randrange(n // 4) * 4
        aimed = min(aimed, n - 4)
        if kind == 0:  # bit flip
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # random byte
            b[rng.randrange(n)] = rng.randrange(256)
        elif kind in (2, 3):  # an interesting word at an aimed or aligned offset
            b[aimed : aimed + 4] = U32.pack(rng.choice(INTERESTING))
        elif kind == 4:  # operation code (or any small number) at an aimed offset
            b[aimed : aimed + 4] = U32.pack(rng.randrange(0, 70))
        elif kind == 5:  # truncation
            del b[rng.randrange(n) :]
        elif kind == 6:  # splice a piece of another message
            d = rng.choice(donors) or bytes(data)
            s = rng.randrange(max(1, len(d)))
            piece = d[s : s + rng.randint(4, 128)]
            at = rng.randrange(n)
            if rng.random() < 0.5:
                b[at:at] = piece
            else:
                b[at : at + len(piece)] = piece
        elif kind == 7:  # delete or duplicate a word range
            s = rng.randrange(n // 4) * 4
            e = min(n, s + 4 * rng.randint(1, 8))
            if rng.random() < 0.5:
                del b[s:e]
            else:
                b[e:e] = b[s:e]
        elif kind == 8:  # a length or count off by a little
            (v,) = U32.unpack_from(b, aimed)
            b[aimed : aimed + 4] = U32.pack((v + rng.choice([-4, -1, 1, 4, 1 << 16])) & 0xFFFFFFFF)
        else:  # random junk appended
            b += rng.randbytes(rng.randint(1, 64))
    return bytes(b)


# -- 1. COMPOUNDs into the server ------------------------------------------------------------


class Wire:
    """The transport under a server-side ``TcpConnection``: what the server writes is parsed
    back into records; closing is reported the way asyncio does it."""

    def __init__(self, proto: TcpConnection, on_record: Callable[[bytes], None], name: str) -> None:
        self.proto = proto
        self.parser = RecordParser(64 << 20)
        self.on_record = on_record
        self.closing = False
        self.name = name

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("fuzz", self.name) if name == "peername" else default

    def writelines(self, pieces: list[Any]) -> None:
        for rec in self.parser.feed(b"".join(bytes(p) for p in pieces)):
            self.on_record(rec)

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.proto.connection_lost, None)

    abort = close

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Link:
    """One in-process connection to the server: calls in, replies matched by XID."""

    def __init__(self, server: NFSServer, name: str, figs: Figures, catcher: ErrorCatcher) -> None:
        self.figs = figs
        self.catcher = catcher
        self.pending: dict[int, list[asyncio.Future[bytes]]] = {}
        self.conn = TcpConnection(f"fuzz:{name}", on_made=server._accept)
        self.conn.connection_made(Wire(self.conn, self._on_record, name))  # type: ignore[arg-type]

    def _on_record(self, rec: bytes) -> None:
        if len(rec) < 8:
            self.figs.wrong_xid += 1
            self.catcher.crashes.append(Crash("COMPOUND", "runt reply", "", rec))
            return
        xid, mtype = struct.unpack_from(">II", rec)
        if mtype == rpc.CALL:
            return  # a callback from the server: not a reply
        futs = self.pending.get(xid)
        if not futs:
            self.figs.wrong_xid += 1
            self.catcher.crashes.append(Crash("COMPOUND", f"wrong xid {xid:#x}", "", rec))
            return
        fut = futs.pop(0)
        if not futs:
            del self.pending[xid]
        if not fut.done():
            fut.set_result(rec)

    async def call(self, msg: bytes, bound: float) -> bytes | None:
        """Send one RPC message; its reply, or None when none is due (or a hang, counted)."""
        expect = len(msg) >= 8 and U32.unpack_from(msg, 4)[0] == rpc.CALL
        fut: asyncio.Future[bytes] | None = None
        if expect:
            fut = asyncio.get_running_loop().create_future()
            self.pending.setdefault(U32.unpack_from(msg, 0)[0], []).append(fut)
        try:
            self.conn.data_received(U32.pack(LAST_FRAGMENT | len(msg)) + msg)
        except Exception as e:
            self.catcher.exception("TcpConnection.data_received", e, msg)
        if fut is None:
            return None
        if self.conn.closed and not fut.done():
            self._forget(msg, fut)
            return None  # the server closed the connection: an answer too
        try:
            return await asyncio.wait_for(asyncio.shield(fut), bound)
        except TimeoutError:
            self.figs.hangs += 1
            self.catcher.crashes.append(_hang(msg))
            self._forget(msg, fut)
            return None

    def _forget(self, msg: bytes, fut: asyncio.Future[bytes]) -> None:
        xid = U32.unpack_from(msg, 0)[0]
        futs = self.pending.get(xid, [])
        if fut in futs:
            futs.remove(fut)
        if not futs:
            self.pending.pop(xid, None)

    def close(self) -> None:
        self.conn.close()


def _hang(msg: bytes) -> Crash:
    return Crash("COMPOUND", "no reply (hang)", "", msg)


def op(num: int, args: Any = None) -> nfs4.nfs_argop4:
    return nfs4.nfs_argop4(nfs4.nfs_opnum4(num), args)


class Calls:
    """Builds RPC calls carrying COMPOUNDs; remembers where the interesting words are."""

    def __init__(self, cred: rpc.opaque_auth) -> None:
        self.cred = cred
        self.xid = 0x10000000

    def next_xid(self) -> int:
        self.xid = (self.xid + 1) & 0xFFFFFFFF
        return self.xid

    def compound(self, ops: list[nfs4.nfs_argop4], tag: bytes = b"") -> tuple[bytes, list[int]]:
        w = Writer()
        message.encode_call(w, self.next_xid(), nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, self.cred)
        nfs4.enc_utf8str_cs(w, tag)
        w += U32.pack(1)
        marks = [0, 4, 8, 12, 16, 20, len(w)]
        w += U32.pack(len(ops))
        data = bytes(w)
        for o in ops:
            marks.append(len(data))
            data += pack(nfs4.enc_nfs_argop4, o)
        return data, marks


def stateid(rng: random.Random, known: list[nfs4.stateid4]) -> nfs4.stateid4:
    r = rng.random()
    if r < 0.4 and known:
        return rng.choice(known)
    if r < 0.6:
        return nfs4.stateid4(1, bytes(12))  # the current stateid
    if r < 0.8:
        return nfs4.stateid4(0, bytes(12))  # anonymous
    return nfs4.stateid4(rng.getrandbits(32), rng.randbytes(12))


def owner(rng: random.Random) -> nfs4.state_owner4:
    return nfs4.state_owner4(0, b"fuzz-owner-%d" % rng.randrange(4))


def body_ops(rng: random.Random, known: list[nfs4.stateid4], fhs: list[bytes]) -> list[Any]:
    """A plausible sequence of operations after SEQUENCE."""
    name = rng.choice(NAMES[:6])
    other = rng.choice(NAMES[:6])
    start = [op(nfs4.OP_PUTROOTFH)]
    if fhs and rng.random() < 0.3:
        start = [op(nfs4.OP_PUTFH, nfs4.PUTFH4args(rng.choice(fhs)))]
    if rng.random() < 0.3:
        start.append(op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"sub")))
    sid = stateid(rng, known)
    kind = rng.randrange(14)
    attrs = nfs4.fattr4([], b"")
    if kind == 0:
        ops = [
            op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
            op(nfs4.OP_GETFH),
            op(nfs4.OP_GETATTR, nfs4.GETATTR4args(rng.choice(ATTRS))),
        ]
    elif kind in (1, 2):
        how = nfs4.openflag4(
            nfs4.OPEN4_CREATE, nfs4.createhow4(nfs4.UNCHECKED4, nfs4.fattr4([], b""))
        )
        if rng.random() < 0.3:
            how = nfs4.openflag4(nfs4.OPEN4_NOCREATE)
        access = rng.choice([1, 2, 3])
        ops = [
            op(
                nfs4.OP_OPEN,
                nfs4.OPEN4args(
                    0,
                    access,
                    rng.choice([0, 0, 1, 3]),
                    owner(rng),
                    how,
                    nfs4.open_claim4(nfs4.CLAIM_NULL, name),
                ),
            ),
            op(nfs4.OP_GETFH),
        ]
        if kind == 1:
            data = rng.randbytes(rng.choice([0, 1, 100, 4096, 70000]))
            ops.append(
                op(
                    nfs4.OP_WRITE,
                    nfs4.WRITE4args(
                        nfs4.stateid4(1, bytes(12)),
                        rng.randrange(1 << 20),
                        nfs4.stable_how4(rng.randrange(3)),
                        data,
                    ),
                )
            )
            ops.append(op(nfs4.OP_READ, nfs4.READ4args(nfs4.stateid4(1, bytes(12)), 0, 8192)))
        else:
            ops.append(
                op(
                    nfs4.OP_LOCK,
                    nfs4.LOCK4args(
                        nfs4.nfs_lock_type4(rng.choice([1, 2, 3, 4])),
                        False,
                        rng.randrange(100),
                        rng.choice([1, 10, 0xFFFFFFFFFFFFFFFF]),
                        nfs4.locker4(
                            True,
                            nfs4.open_to_lock_owner4(0, nfs4.stateid4(1, bytes(12)), 0, owner(rng)),
                        ),
                    ),
                )
            )
            ops.append(op(nfs4.OP_LOCKT, nfs4.LOCKT4args(nfs4.READ_LT, 0, 10, owner(rng))))
            ops.append(
                op(
                    nfs4.OP_LOCKU,
                    nfs4.LOCKU4args(nfs4.READ_LT, 0, nfs4.stateid4(1, bytes(12)), 0, 10),
                )
            )
        if rng.random() < 0.8:
            ops.append(op(nfs4.OP_CLOSE, nfs4.CLOSE4args(0, nfs4.stateid4(1, bytes(12)))))
    elif kind == 3:
        t = rng.choice(
            [
                nfs4.createtype4(nfs4.NF4DIR),
                nfs4.createtype4(nfs4.NF4LNK, b"../../etc"),
                nfs4.createtype4(nfs4.NF4FIFO),
            ]
        )
        ops = [op(nfs4.OP_CREATE, nfs4.CREATE4args(t, name, attrs)), op(nfs4.OP_GETFH)]
    elif kind == 4:
        ops = [
            op(
                nfs4.OP_READDIR,
                nfs4.READDIR4args(
                    rng.choice([0, 3, 12345]),
                    bytes(8),
                    rng.choice([0, 100, 8192]),
                    rng.choice([0, 100, 32768]),
                    rng.choice(ATTRS),
                ),
            )
        ]
    elif kind == 5:
        ops = [op(nfs4.OP_SAVEFH), op(nfs4.OP_RENAME, nfs4.RENAME4args(name, other))]
    elif kind == 6:
        ops = [op(nfs4.OP_REMOVE, nfs4.REMOVE4args(name))]
    elif kind == 7:
        ops = [
            op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
            op(
                nfs4.OP_READ,
                nfs4.READ4args(
                    sid, rng.choice([0, 1 << 62]), rng.choice([0, 10, 1 << 20, 0xFFFFFFFF])
                ),
            ),
        ]
    elif kind == 8:
        ops = [
            op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
            op(
                nfs4.OP_SETATTR,
                nfs4.SETATTR4args(sid, nfs4.fattr4([1 << 4], U32.pack(0) + U32.pack(5))),
            ),
            op(nfs4.OP_ACCESS, nfs4.ACCESS4args(0x3F)),
            op(nfs4.OP_READLINK),
        ]
    elif kind == 9:
        ops = [
            op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
            op(nfs4.OP_SAVEFH),
            op(nfs4.OP_PUTROOTFH),
            op(nfs4.OP_LINK, nfs4.LINK4args(other)),
        ]
    elif kind == 10:
        ops = [
            op(nfs4.OP_TEST_STATEID, nfs4.TEST_STATEID4args([sid, stateid(rng, known)])),
            op(nfs4.OP_FREE_STATEID, nfs4.FREE_STATEID4args(sid)),
            op(nfs4.OP_DELEGRETURN, nfs4.DELEGRETURN4args(sid)),
        ]
    elif kind == 11:
        ops = [
            op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH),
            op(nfs4.OP_LOOKUPP),
            op(nfs4.OP_GETFH),
            op(nfs4.OP_SECINFO, nfs4.SECINFO4args(name)),
        ]
    elif kind == 12:
        ops = [
            op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(name)),
            op(nfs4.OP_COMMIT, nfs4.COMMIT4args(0, 0)),
            op(nfs4.OP_VERIFY, nfs4.VERIFY4args(nfs4.fattr4([1 << 4], bytes(8)))),
            op(nfs4.OP_NVERIFY, nfs4.NVERIFY4args(nfs4.fattr4([1 << 4], bytes(8)))),
        ]
    else:
        ops = [
            op(nfs4.OP_RECLAIM_COMPLETE, nfs4.RECLAIM_COMPLETE4args(False)),
            op(nfs4.OP_RESTOREFH),
            op(nfs4.OP_PUTPUBFH),
            op(nfs4.OP_OPENATTR, nfs4.OPENATTR4args(False)),
            op(nfs4.OP_GETATTR, nfs4.GETATTR4args([1])),
        ]
    return start + ops


class Session:
    """A real session on a link, with the slot table as the replies say it is."""

    def __init__(self, link: Link, calls: Calls, owner_id: bytes) -> None:
        self.link = link
        self.calls = calls
        self.owner_id = owner_id
        self.sessionid = b""
        self.seq: list[int] = []
        self.busy: set[int] = set()
        self.dead: set[int] = set()

    async def setup(self, bound: float) -> None:
        for _ in range(200):
            if await self._try_setup(bound):
                return
            await asyncio.sleep(0.05)  # NFS4ERR_DELAY (rate limits): try again
        raise RuntimeError("cannot create a session")

    async def _try_setup(self, bound: float) -> bool:
        eid = nfs4.EXCHANGE_ID4args(
            nfs4.client_owner4(b"fuzzverf", self.owner_id),
            0,
            nfs4.state_protect4_a(nfs4.SP4_NONE),
            [],
        )
        res = await self._one([op(nfs4.OP_EXCHANGE_ID, eid)], bound)
        if res is None or res.status != nfs4.NFS4_OK:
            return False
        ok = res.resarray[0].value.value
        attrs = nfs4.channel_attrs4(0, 1 << 20, 1 << 20, 64 << 10, 16, 32, [])
        back = nfs4.channel_attrs4(0, 4096, 4096, 4096, 4, 1, [])
        cs = nfs4.CREATE_SESSION4args(
            ok.eir_clientid,
            ok.eir_sequenceid,
            0,
            attrs,
            back,
            0x40000000,
            [nfs4.callback_sec_parms4(nfs4.AUTH_NONE)],
        )
        res = await self._one([op(nfs4.OP_CREATE_SESSION, cs)], bound)
        if res is None or res.status != nfs4.NFS4_OK:
            return False
        sok = res.resarray[0].value.value
        if self.sessionid:  # forget the old one (it may be gone already)
            await self._one(
                [op(nfs4.OP_DESTROY_SESSION, nfs4.DESTROY_SESSION4args(self.sessionid))], bound
            )
        self.sessionid = sok.csr_sessionid
        n = sok.csr_fore_chan_attrs.ca_maxrequests
        self.seq = [0] * n
        self.busy = set()
        self.dead = set()
        return True

    async def _one(self, ops: list[Any], bound: float) -> nfs4.COMPOUND4res | None:
        msg, _ = self.calls.compound(ops)
        rec = await self.link.call(msg, bound)
        return None if rec is None else decode_res(rec)

    def free_slot(self, rng: random.Random) -> int | None:
        free = [s for s in range(len(self.seq)) if s not in self.busy and s not in self.dead]
        return rng.choice(free) if free else None

    def sequence(self, slot: int) -> nfs4.nfs_argop4:
        seq = (self.seq[slot] + 1) & 0xFFFFFFFF
        args = nfs4.SEQUENCE4args(self.sessionid, seq, slot, len(self.seq) - 1, slot % 2 == 0)
        return op(nfs4.OP_SEQUENCE, args)

    def learn(self, slot: int, res: nfs4.COMPOUND4res | None, mutated: bool) -> str:
        """Update the slot table from a reply; 'renew' when the session must be replaced."""
        if res is None or not res.resarray:
            return ""
        first = res.resarray[0]
        if first.resop != nfs4.OP_SEQUENCE:
            return ""
        sr = first.value
        if sr.sr_status == nfs4.NFS4_OK:
            ok = sr.value
            if ok.sr_sessionid == self.sessionid and ok.sr_slotid < len(self.seq):
                self.seq[ok.sr_slotid] = ok.sr_sequenceid
            return ""
        if sr.sr_status in (nfs4.NFS4ERR_BADSESSION, nfs4.NFS4ERR_STALE_CLIENTID) and not mutated:
            return "renew"
        if sr.sr_status == nfs4.NFS4ERR_SEQ_MISORDERED and not mutated:
            self.dead.add(slot)  # out of step (a mutated call used it): leave it
            if len(self.dead) > len(self.seq) // 2:
                return "renew"
        return ""


def tidy(export: Path, limit: int) -> None:
    """Keep the scratch export usable and small: COMPOUNDs may have changed its mode (SETATTR
    on the root) or filled it; beyond ``limit`` entries everything in it goes (handles then
    go stale, which is more input)."""
    with contextlib.suppress(OSError):
        os.chmod(export, 0o755)
    entries = 0
    for top, dirs, files in os.walk(export, onerror=lambda e: None):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(top, d), 0o755, follow_symlinks=False)
        entries += len(dirs) + len(files)
    if entries <= limit:
        return
    for child in list(export.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


def decode_res(rec: bytes) -> nfs4.COMPOUND4res | None:
    try:
        header, off = message.decode_reply(Reader(rec))
        acc = header.accepted
        if acc is None or acc.reply_data.stat != rpc.SUCCESS:
            return None
        res, _ = nfs4.dec_COMPOUND4res(Reader(rec), off)
        return res
    except XdrError:
        return None


def _reply_status(rec: bytes) -> int:
    """RPC accept status (0..5), 100 + deny, or 1000 + nfsstat4."""
    try:
        header, off = message.decode_reply(Reader(rec))
    except XdrError:
        return -1
    acc = header.accepted
    if acc is None:
        return 100
    if acc.reply_data.stat != rpc.SUCCESS:
        return int(acc.reply_data.stat)
    if off + 4 <= len(rec):
        return 1000 + U32.unpack_from(rec, off)[0]
    return -1


async def tcp_exchange(
    port: int, rng: random.Random, msg: bytes, figs: Figures, catcher: ErrorCatcher, bound: float
) -> None:
    """One call through a real socket, in random fragments; half the time a mark is mutated.
    With valid framing the reply must come back with the call's XID; otherwise the server may
    close the connection or wait for more, never crash."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        frags: list[bytes] = []
        pos = 0
        while True:
            n = rng.choice([0, 1, 2, 3, 7, 64, len(msg)])
            part = msg[pos : pos + n]
            pos += len(part)
            last = pos >= len(msg)
            frags.append(U32.pack((LAST_FRAGMENT if last else 0) | len(part)) + part)
            if last or len(frags) > 64:
                break
        stream = b"".join(frags) if pos >= len(msg) else U32.pack(LAST_FRAGMENT | len(msg)) + msg
        if rng.random() < 0.5:
            stream = mutate(rng, stream, [msg], [0])
        writer.write(stream)
        await writer.drain()
        # The calls this stream carries (a mutated mark may still frame whole records).
        xids = set()
        with contextlib.suppress(ConnectionError):
            for rec in RecordParser().feed(stream):
                if len(rec) >= 8 and U32.unpack_from(rec, 4)[0] == rpc.CALL:
                    xids.add(rec[:4])
        expect = bool(xids)
        parser = RecordParser(64 << 20)
        deadline = time.monotonic() + (bound if expect else 0.05)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if expect:
                    figs.hangs += 1
                    catcher.crashes.append(_hang(stream))
                return
            try:
                data = await asyncio.wait_for(reader.read(1 << 16), left)
            except TimeoutError:
                continue
            except ConnectionError:
                return
            if not data:
                return  # closed by the server
            for rec in parser.feed(data):
                if len(rec) >= 8 and U32.unpack_from(rec, 4)[0] == rpc.CALL:
                    continue
                figs.replies += 1
                if rec[:4] not in xids:
                    figs.wrong_xid += 1
                    catcher.crashes.append(Crash("TCP", "wrong xid", "", stream))
                return
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def compound_campaign(
    n: int, seed: int, args: argparse.Namespace, catcher: ErrorCatcher, rss: Rss
) -> Figures:
    figs = Figures()
    rng = random.Random(seed)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-export-"))
    state = Path(tempfile.mkdtemp(prefix="fuzz-state-"))
    export = scratch / "export"
    export.mkdir()
    server = NFSServer(
        str(export),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        root_squash=False,
        state_dir=str(state),
    )
    await server.start()
    calls = Calls(auth_sys(uid=os.getuid(), gid=os.getgid(), machinename="fuzz"))
    t0 = time.perf_counter()
    try:
        window = max(1, args.window)
        links = [Link(server, f"c{i}", figs, catcher) for i in range(window)]
        sessions = [Session(links[i], calls, b"fuzz-client-%d" % i) for i in range(window)]
        for s in sessions:
            await s.setup(args.hang_bound)
        fhs: list[bytes] = []
        known: list[nfs4.stateid4] = []
        donors: list[bytes] = []
        done = 0
        next_report = time.perf_counter() + args.progress

        async def one(i: int, k: int) -> None:
            nonlocal done
            s = sessions[i]
            if s.link.conn.closed:
                s.link = Link(server, f"c{i}-{k}", figs, catcher)
                await s.setup(args.hang_bound)
            slot = s.free_slot(rng)
            if slot is None:
                await s.setup(args.hang_bound)
                slot = s.free_slot(rng) or 0
            ops = [s.sequence(slot), *body_ops(rng, known, fhs)]
            msg, marks = calls.compound(ops, tag=rng.choice([b"", b"fuzz"]))
            mutated = k % args.clean_every != 0
            if mutated:
                seq_end = marks[8] if len(marks) > 8 else len(msg)
                if rng.random() < 0.7:  # leave the SEQUENCE intact: reach the operations
                    head, tail = msg[:seq_end], msg[seq_end:]
                    msg = head + mutate(rng, tail, donors, [m - seq_end for m in marks[8:]])
                else:
                    msg = mutate(rng, msg, donors, marks)
            if len(donors) < 64:
                donors.append(msg)
            else:
                donors[rng.randrange(64)] = msg
            if args.tcp_every and k % args.tcp_every == 0:
                await tcp_exchange(server.tcp_port, rng, msg, figs, catcher, args.hang_bound)
                figs.inputs += 1
                done += 1
                return
            s.busy.add(slot)
            catcher.current = ("COMPOUND", msg)
            rec = await s.link.call(msg, args.hang_bound)
            s.busy.discard(slot)
            figs.inputs += 1
            done += 1
            if rec is None:
                return
            figs.replies += 1
            st = _reply_status(rec)
            figs.statuses[st] = figs.statuses.get(st, 0) + 1
            res = decode_res(rec)
            if res is not None:
                for r in res.resarray:
                    v = r.value
                    if r.resop == nfs4.OP_GETFH and v.status == 0 and len(fhs) < 32:
                        fhs.append(v.value.object)
                    if r.resop == nfs4.OP_OPEN and v.status == 0 and len(known) < 32:
                        known.append(v.value.stateid)
            if s.learn(slot, res, mutated) == "renew":
                await s.setup(args.hang_bound)

        k = 0
        while k < n:
            batch = min(window, n - k)
            await asyncio.gather(*(one(i, k + i) for i in range(batch)))
            k += batch
            if k % 2000 < window:
                rss.sample()
                tidy(export, 3000)
            if time.perf_counter() >= next_report:
                next_report += args.progress
                el = time.perf_counter() - t0
                step(
                    f"compounds {k}/{n} ({k / el:.0f}/s) crashes={len(catcher.crashes)} "
                    f"hangs={figs.hangs} wrong_xid={figs.wrong_xid} rss={rss.sample() // 1024} MiB"
                )
        for link in {s.link for s in sessions}:
            link.close()
    finally:
        figs.seconds = time.perf_counter() - t0
        await server.close()
        tidy(export, 0)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    return figs


# -- 2. RPC-over-RDMA headers ----------------------------------------------------------------


def random_header(rng: random.Random) -> bytes:
    def seg() -> rh.Segment:
        return rh.Segment(
            rng.getrandbits(32),
            rng.choice([0, 1, 4, 100, 4096, 1 << 20, 1 << 25]),
            rng.getrandbits(64),
        )

    proc = rng.choice([rh.RDMA_MSG, rh.RDMA_MSG, rh.RDMA_NOMSG])
    reads = []
    if rng.random() < 0.5:
        pos = 0 if proc == rh.RDMA_NOMSG else rng.choice([4, 64, 100, 1024])
        reads.append(rh.ReadChunk(pos, [seg() for _ in range(rng.randint(1, 3))]))
        if rng.random() < 0.3:
            reads.append(rh.ReadChunk(pos + 128, [seg()]))
    writes = [[seg() for _ in range(rng.randint(1, 3))] for _ in range(rng.choice([0, 0, 1, 2]))]
    reply = [seg() for _ in range(rng.randint(1, 2))] if rng.random() < 0.4 else None
    if rng.random() < 0.1:
        return rh.encode_error(rng.getrandbits(32), rng.randrange(64), rng.choice([1, 2]))
    hdr = rh.encode(rng.getrandbits(32), rng.randrange(128), proc, reads, writes, reply)
    return hdr + rng.randbytes(rng.choice([0, 8, 40]))


def reply_writer(rng: random.Random) -> Writer:
    w = Writer()
    w += rng.randbytes(rng.choice([24, 200, 2000, 9000]))
    for tag in range(rng.choice([0, 1, 2])):
        data = rng.randbytes(rng.choice([1, 100, 5000]))
        w.ddp.append(DdpItem(len(w), data, tag))
    return w


def header_campaign(n: int, seed: int, catcher: ErrorCatcher, rss: Rss, progress: float) -> Figures:
    figs = Figures()
    rng = random.Random(seed + 1)
    limits = rh.ChunkLimits()
    donors = [random_header(rng) for _ in range(32)]
    t0 = time.perf_counter()
    next_report = t0 + progress
    for k in range(n):
        raw = random_header(rng) if k % 8 else donors[k % 32]
        data = mutate(rng, raw, donors, [0, 4, 8, 12, 16, 20, 24]) if k % 16 else raw
        if k % 1024 == 0:
            donors[rng.randrange(32)] = data
        figs.inputs += 1
        try:
            h = rh.parse(data)
            if h.proc in (rh.RDMA_MSG, rh.RDMA_NOMSG):
                rh.check_call(h, max(0, len(data) - h.size), limits)
                plan = marshal.plan_reply(reply_writer(rng), h, rng.choice([1024, 4096]))
                for wr in plan.writes:  # the plan stays inside what was offered
                    if len(wr.data) > wr.segment.length:
                        raise AssertionError(f"RDMA Write of {len(wr.data)} into {wr.segment}")
        except rh.HeaderError:
            figs.refused += 1
        except Exception as e:
            catcher.exception("rpcrdma header", e, data)
        if k % 50000 == 0:
            rss.sample()
        if time.perf_counter() >= next_report:
            next_report += progress
            step(f"headers {k}/{n} ({k / (time.perf_counter() - t0):.0f}/s)")
    figs.seconds = time.perf_counter() - t0
    return figs


# -- 3. RFC 8797 private data ----------------------------------------------------------------


def privdata_campaign(n: int, seed: int, catcher: ErrorCatcher, rss: Rss) -> Figures:
    figs = Figures()
    rng = random.Random(seed + 2)
    t0 = time.perf_counter()
    ident = privdata.FORMAT_IDENTIFIER.to_bytes(4, "big")
    for k in range(n):
        r = rng.random()
        if r < 0.2:
            data = rng.randbytes(rng.randrange(0, 200))
        else:
            pd = privdata.PrivateData.for_buffers(
                rng.choice([1024, 4096, 262144, 1 << 20]),
                rng.choice([1024, 8192]),
                remote_invalidate=rng.random() < 0.5,
            )
            data = privdata.encode(pd, extension=rng.randbytes(rng.choice([0, 0, 8, 48])))
            data = rng.randbytes(rng.choice([0, 0, 1, 3, 13])) + data
            if r < 0.7:
                data = mutate(rng, data, [ident * 3], [0, 4])
            if rng.random() < 0.2:
                data = data + ident
        figs.inputs += 1
        try:
            mine = privdata.decode(data)
            theirs = privdata.decode(data[::-1]) if k % 2 else None
            t = privdata.inline_thresholds(mine, theirs)
            if not (1024 <= t.client_to_server <= 262144 and 1024 <= t.server_to_client <= 262144):
                raise AssertionError(f"thresholds out of range: {t}")
            if mine is not None:
                privdata.check_receive_provisioning(mine, rng.choice([1024, 262144]))
        except privdata.PrivateDataError:
            figs.refused += 1
        except Exception as e:
            catcher.exception("privdata", e, data)
        if k % 20000 == 0:
            rss.sample()
    figs.seconds = time.perf_counter() - t0
    return figs


# -- 4. callbacks into our client ------------------------------------------------------------


async def cb_campaign(
    n: int, seed: int, args: argparse.Namespace, catcher: ErrorCatcher, rss: Rss
) -> Figures:
    figs = Figures()
    rng = random.Random(seed + 3)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-cb-"))
    (scratch / "export").mkdir()
    (scratch / "state").mkdir()
    server = NFSServer(
        str(scratch / "export"),
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        root_squash=False,
        state_dir=str(scratch / "state"),
    )
    await server.start()
    t0 = time.perf_counter()
    try:
        async with nfsrdma.connect(f"nfs://127.0.0.1:{server.tcp_port}/", uid=0, gid=0) as fs:
            session = fs.session
            await fs.write_bytes("cbfile", b"data")
            fh = rng.randbytes(24)  # a file handle is opaque to the client's back channel
            bc = session.backchannel
            cb_link = _ClientSide(session.dispatcher, figs, catcher)
            calls = Calls(rpc.opaque_auth(rpc.AUTH_NONE, b""))
            table = bc.slots  # a list of slots, or (newer) a ResponderSlots holding them
            seq = [0] * len(getattr(table, "slots", table))
            donors: list[bytes] = []
            for k in range(n):
                slot = rng.randrange(len(seq))
                cb_seq = nfs4.CB_SEQUENCE4args(
                    bc.sessionid,
                    (seq[slot] + 1) & 0xFFFFFFFF,
                    slot,
                    len(seq) - 1,
                    rng.random() < 0.5,
                    [],
                )
                ops = [nfs4.nfs_cb_argop4(nfs4.OP_CB_SEQUENCE, cb_seq)]
                for _ in range(rng.randint(0, 3)):
                    ops.append(_cb_op(rng, fh))
                cb_args = nfs4.CB_COMPOUND4args(b"", 1, 0, ops)
                w = Writer()
                message.encode_call(w, calls.next_xid(), session.opts.cb_program, 1, 1, calls.cred)
                head = len(w)
                w += pack(nfs4.enc_CB_COMPOUND4args, cb_args)
                msg = bytes(w)
                if k % 8:
                    msg = mutate(rng, msg, donors or [msg], [0, 4, 12, 16, 20, head, head + 12])
                if len(donors) < 32:
                    donors.append(msg)
                catcher.current = ("CB_COMPOUND", msg)
                rec = await cb_link.call(msg, args.hang_bound)
                figs.inputs += 1
                if rec is not None:
                    figs.replies += 1
                    try:
                        _, off = message.decode_reply(Reader(rec))
                        res, _ = nfs4.dec_CB_COMPOUND4res(Reader(rec), off)
                        first = res.resarray[0] if res.resarray else None
                        st = 1000 + res.status
                        figs.statuses[st] = figs.statuses.get(st, 0) + 1
                        if first is not None and first.resop == nfs4.OP_CB_SEQUENCE:
                            v = first.value
                            if v.csr_status == nfs4.NFS4_OK and v.value.csr_slotid < len(seq):
                                seq[v.value.csr_slotid] = v.value.csr_sequenceid
                    except (XdrError, AttributeError):
                        pass
                if k % 5000 == 0:
                    rss.sample()
            await asyncio.sleep(0)
            cb_link.close()
    finally:
        figs.seconds = time.perf_counter() - t0
        await server.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return figs


def _cb_op(rng: random.Random, fh: bytes) -> nfs4.nfs_cb_argop4:
    k = rng.randrange(6)
    sid = nfs4.stateid4(rng.getrandbits(32), rng.randbytes(12))
    if k == 0:
        return nfs4.nfs_cb_argop4(
            nfs4.OP_CB_RECALL, nfs4.CB_RECALL4args(sid, rng.random() < 0.5, fh)
        )
    if k == 1:
        own = nfs4.state_owner4(rng.getrandbits(64), rng.randbytes(rng.choice([0, 8, 28])))
        return nfs4.nfs_cb_argop4(nfs4.OP_CB_NOTIFY_LOCK, nfs4.CB_NOTIFY_LOCK4args(fh, own))
    if k == 2:
        return nfs4.nfs_cb_argop4(
            nfs4.OP_CB_RECALL_SLOT, nfs4.CB_RECALL_SLOT4args(rng.randrange(70))
        )
    if k == 3:
        return nfs4.nfs_cb_argop4(
            nfs4.OP_CB_RECALL_ANY, nfs4.CB_RECALL_ANY4args(rng.randrange(4), [1])
        )
    if k == 4:
        return nfs4.nfs_cb_argop4(nfs4.OP_CB_GETATTR, nfs4.CB_GETATTR4args(fh, [3]))
    return nfs4.nfs_cb_argop4(nfs4.OP_CB_ILLEGAL)


class _ClientSide:
    """A connection into the client's own RPC dispatcher (the one its connections use for
    the back channel); what it answers is matched by XID."""

    def __init__(self, dispatcher: Any, figs: Figures, catcher: ErrorCatcher) -> None:
        self.figs = figs
        self.catcher = catcher
        self.pending: dict[int, list[asyncio.Future[bytes]]] = {}
        self.conn = TcpConnection("cbfuzz")
        self.conn.connection_made(Wire(self.conn, self._on_record, "cbfuzz"))  # type: ignore[arg-type]
        self.rpc = RpcConnection(self.conn, dispatcher)

    _on_record = Link._on_record
    call = Link.call
    _forget = Link._forget

    def close(self) -> None:
        self.conn.close()


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compounds", type=int, default=10**6)
    ap.add_argument("--headers", type=int, default=10**6)
    ap.add_argument("--privdata", type=int, default=10**5)
    ap.add_argument("--cb", type=int, default=10**5)
    ap.add_argument("--window", type=int, default=8, help="COMPOUNDs in flight (one link each)")
    ap.add_argument("--tcp-every", type=int, default=50, help="one in N through a real socket")
    ap.add_argument("--clean-every", type=int, default=10, help="one in N left unmutated")
    ap.add_argument("--hang-bound", type=float, default=10.0, help="seconds to wait for a reply")
    ap.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the server's own chatter is not a figure
    logging.getLogger("nfsrdma").setLevel(logging.ERROR)
    catcher = ErrorCatcher()
    rss = Rss()
    t0 = time.perf_counter()

    async def campaigns() -> tuple[Figures, Figures]:
        asyncio.get_running_loop().set_exception_handler(catcher.loop_handler)
        c = await compound_campaign(args.compounds, args.seed, args, catcher, rss)
        cb = await cb_campaign(args.cb, args.seed, args, catcher, rss)
        return c, cb

    with catcher.installed():
        step(f"COMPOUNDs: {args.compounds} (seed {args.seed})")
        c, cb = asyncio.run(campaigns())
        step(f"RPC-over-RDMA headers: {args.headers}")
        catcher.current = ("rpcrdma header", b"")
        h = header_campaign(args.headers, args.seed, catcher, rss, args.progress)
        step(f"private data: {args.privdata}")
        p = privdata_campaign(args.privdata, args.seed, catcher, rss)
    rss.sample()
    total = time.perf_counter() - t0
    for name, f in (
        ("COMPOUNDs", c),
        ("CB_COMPOUNDs", cb),
        ("RDMA headers", h),
        ("private data", p),
    ):
        rate = f.inputs / f.seconds if f.seconds else 0.0
        print(
            f"{name:13} {f.inputs:9d} inputs in {f.seconds:7.1f} s ({rate:8.0f}/s), "
            f"replies {f.replies}, refused {f.refused}, hangs {f.hangs}, wrong xid {f.wrong_xid}"
        )
    for name, f in (("COMPOUND", c), ("CB_COMPOUND", cb)):
        top = sorted(f.statuses.items(), key=lambda kv: -kv[1])[:10]
        ok = f.statuses.get(1000, 0)
        print(
            f"{name} replies NFS4_OK: {ok}; commonest (rpc accept stat, 100 denied, "
            f"1000+nfsstat4): {dict(top)}"
        )
    crashes = catcher.crashes
    real = [x for x in crashes if x.what != "no reply (hang)" and "xid" not in x.what]
    report_crashes(crashes)
    hangs = c.hangs + cb.hangs
    print(
        f"total {total:.1f} s; RSS {rss.start // 1024} MiB at start, {rss.max // 1024} MiB at most, "
        f"{rss.end // 1024} MiB at end"
    )
    print(
        f"compounds={c.inputs} headers={h.inputs} privdata={p.inputs} cb={cb.inputs} "
        f"crashes={len(real)} hangs={hangs} wrong_xid={c.wrong_xid + cb.wrong_xid} "
        f"rss_start_mib={rss.start // 1024} rss_max_mib={rss.max // 1024} "
        f"rss_end_mib={rss.end // 1024}"
    )
    missed = bool(real or hangs or c.wrong_xid + cb.wrong_xid)
    return 1 if missed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
