"""NFSv4.2 over RPC-over-RDMA (RFC 8267 section 6.1): no new DDP-eligible items. READ_PLUS
data, xattr values and names, COPY and WRITE_SAME arguments all travel in the byte stream; a
READ_PLUS or LISTXATTRS reply too large for a Send goes whole in the Reply chunk, even when the
requester also offered a Write chunk (it comes back unused). End to end on the in-process
verbs provider: our client's READ_PLUS and LISTXATTRS against our server."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nfsrdma.transport.rdma import header as H
from nfsrdma.transport.rdma.marshal import plan_reply
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.regen import NFS4_DDP
from nfsrdma.xdr.runtime import Reader, Writer

from ..client.test_rdma_inproc import rdma_client
from .test_marshal import call_header, seg

STATEID = nfs4.stateid4(1, b"s" * 12)


def reply_of(results: list[tuple[int, object]]) -> Writer:
    """A COMPOUND4res encoded as compound.py does (only READ and READLINK get DDP tags)."""
    w = Writer()
    w += b"\0" * 24
    w += b"\0" * 4
    nfs4.enc_utf8str_cs(w, b"")
    w += len(results).to_bytes(4, "big")
    for op, res in results:
        nfs4.enc_nfs_resop4(w, nfs4.nfs_resop4(op, res))
    return w


def read_plus(data: bytes) -> tuple[int, object]:
    contents = [
        nfs4.read_plus_content(nfs4.NFS4_CONTENT_DATA, nfs4.data4(0, data)),
        nfs4.read_plus_content(nfs4.NFS4_CONTENT_HOLE, nfs4.data_info4(len(data), 1 << 20)),
    ]
    return nfs4.OP_READ_PLUS, nfs4.READ_PLUS4res(nfs4.NFS4_OK, nfs4.read_plus_res4(False, contents))


def test_the_ddp_items_are_still_rfc_8267s_four() -> None:
    assert {
        ("WRITE4args", "data"),
        ("createtype4", "linkdata"),
        ("READ4resok", "data"),
        ("READLINK4resok", "link"),
    } == NFS4_DDP
    w = Writer()
    big = b"v" * 65536
    for argop in (
        nfs4.nfs_argop4(nfs4.OP_SETXATTR, nfs4.SETXATTR4args(nfs4.SETXATTR4_EITHER, b"name", big)),
        nfs4.nfs_argop4(
            nfs4.OP_WRITE_SAME,
            nfs4.WRITE_SAME4args(
                STATEID, nfs4.UNSTABLE4, nfs4.app_data_block4(0, 8, 1, 0, 0, 0, big)
            ),
        ),
        nfs4.nfs_argop4(
            nfs4.OP_COPY, nfs4.COPY4args(STATEID, STATEID, 0, 0, 1 << 30, True, False, [])
        ),
    ):
        nfs4.enc_nfs_argop4(w, argop)
    w2 = reply_of([read_plus(big), (nfs4.OP_GETXATTR, nfs4.GETXATTR4res(nfs4.NFS4_OK, big))])
    assert w.ddp == [] and w2.ddp == []


def test_a_large_read_plus_reply_goes_whole_in_the_reply_chunk() -> None:
    data = os.urandom(64 << 10)
    msg = reply_of([read_plus(data)])
    total = len(msg.flatten())
    # The requester offered a Write chunk as well: READ_PLUS must not use it (UL-1).
    call = call_header([[seg(0xA, 1 << 20)]], [seg(0xD, 128 << 10)])
    plan = plan_reply(msg, call, send_limit=4096)
    assert plan.proc == H.RDMA_NOMSG and plan.inline == []
    assert plan.write_list == [[seg(0xA, 0)]]
    assert plan.reply == [seg(0xD, total)]
    assert b"".join(bytes(w.data) for w in plan.writes) == msg.flatten()
    res, _ = nfs4.dec_COMPOUND4res(Reader(msg.flatten()), 24)
    assert bytes(res.resarray[0].value.value.rpr_contents[0].value.d_data) == data
    # Small enough for a Send: inline, the Reply chunk comes back empty.
    plan = plan_reply(reply_of([read_plus(b"x" * 100)]), call, send_limit=4096)
    assert plan.proc == H.RDMA_MSG and plan.reply == [seg(0xD, 0)]


def test_a_large_listxattrs_reply_goes_in_the_reply_chunk() -> None:
    names = [f"attribute-{i:04d}".encode() for i in range(400)]
    resok = nfs4.LISTXATTRS4resok(400, names, True)
    msg = reply_of([(nfs4.OP_LISTXATTRS, nfs4.LISTXATTRS4res(nfs4.NFS4_OK, resok))])
    plan = plan_reply(msg, call_header([], [seg(0xD, 32 << 10)]), send_limit=4096)
    assert plan.proc == H.RDMA_NOMSG
    assert b"".join(bytes(w.data) for w in plan.writes) == msg.flatten()


@pytest.fixture
def shm_path() -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm): it keeps hundreds of user attributes on one file,
    where ext4 keeps one block's worth."""
    d = Path(tempfile.mkdtemp(prefix="nfs42-", dir="/dev/shm"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def test_read_plus_and_listxattrs_over_rdma_end_to_end(shm_path: Path) -> None:
    tmp_path = shm_path
    data = os.urandom(200_000)
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(1 << 20)  # a hole after the data
    names = [f"attribute-{i:04d}" for i in range(300)]
    for n in names:
        os.setxattr(path, f"user.{n}", b"v")
    async with rdma_client(tmp_path) as (fs, conns):
        assert fs.minor_version == 2
        async with fs.open("f", "rb") as f:
            args = nfs4.READ_PLUS4args(f.stateid, 0, 1 << 20)
            res = await fs.session.compound(
                [
                    nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(f.fh)),
                    nfs4.nfs_argop4(nfs4.OP_READ_PLUS, args),
                ],
                reply_size=(1 << 20) + 4096,
            )
            assert res.status == nfs4.NFS4_OK
            body = res.resarray[1].value.value
            got = bytearray(1 << 20)
            for seg_ in body.rpr_contents:
                if seg_.rpc_content == nfs4.NFS4_CONTENT_DATA:
                    v = seg_.value
                    got[v.d_offset : v.d_offset + len(v.d_data)] = v.d_data
            assert bytes(got) == path.read_bytes()
            assert any(s.rpc_content == nfs4.NFS4_CONTENT_HOLE for s in body.rpr_contents)
        assert await fs.listxattr("f") == names  # ~6 KiB of names: more than one Send
        assert sum(c.stats["reply_chunks"] for c in conns) >= 2
