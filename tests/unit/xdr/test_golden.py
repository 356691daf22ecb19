"""Golden vectors: messages laid out word by word from the RFCs, compared byte for byte with
what the generated codecs produce, and decoded back."""

from __future__ import annotations

import pytest

from nfsrdma.rpc import message
from nfsrdma.rpc.auth import auth_sys, credential_of
from nfsrdma.xdr.gen import nfs4, rpc, rpcrdma
from nfsrdma.xdr.runtime import Reader, Writer, pack, unpack


def words(*ws: int) -> bytes:
    return b"".join(w.to_bytes(4, "big") for w in ws)


def test_rpc_call_with_auth_sys() -> None:
    """RFC 5531 sections 9 and A: a COMPOUND call header with an AUTH_SYS credential."""
    # AUTH_SYS body: stamp, machinename "node1" (5 bytes + 3 of padding), uid, gid, gids<16>.
    body = words(0x5EED) + words(5) + b"node1\x00\x00\x00" + words(1000, 100) + words(2, 10, 20)
    expected = words(0x1234ABCD, 0, 2, 100003, 4, 1) + words(1, len(body)) + body + words(0, 0)
    assert len(body) == 36
    w = Writer()
    cred = auth_sys(uid=1000, gid=100, gids=[10, 20], machinename="node1", stamp=0x5EED)
    message.encode_call(w, 0x1234ABCD, nfs4.NFS4_PROGRAM, nfs4.NFS_V4, nfs4.NFSPROC4_COMPOUND, cred)
    assert bytes(w) == expected
    xid, call, off = message.decode_call(Reader(expected))
    assert (xid, call.prog, call.vers, call.proc, off) == (0x1234ABCD, 100003, 4, 1, len(expected))
    c = credential_of(call.cred, call.verf)
    assert (c.uid, c.gid, c.gids, c.machinename) == (1000, 100, (10, 20), "node1")


def test_sequence_putfh_getattr_compound() -> None:
    """RFC 5662: COMPOUND4args { tag, minorversion 1, [SEQUENCE, PUTFH, GETATTR] }."""
    sid = bytes(range(16))
    fh = b"\xaa\xbb\xcc\xdd\xee"
    expected = (
        words(0)  # tag "" (utf8str_cs)
        + words(1)  # minorversion
        + words(3)  # argarray<> count
        + words(53)
        + sid
        + words(7, 2, 3, 1)  # OP_SEQUENCE: sessionid, seqid, slot, highest, cachethis
        + words(22)
        + words(5)
        + fh
        + b"\x00\x00\x00"  # OP_PUTFH: nfs_fh4<128>
        + words(9)
        + words(2, 0x0010011A, 0x00B0A23A)  # OP_GETATTR: bitmap4<> of 2 words
    )
    args = nfs4.COMPOUND4args(
        tag=b"",
        minorversion=1,
        argarray=[
            nfs4.nfs_argop4(nfs4.OP_SEQUENCE, nfs4.SEQUENCE4args(sid, 7, 2, 3, True)),
            nfs4.nfs_argop4(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
            nfs4.nfs_argop4(nfs4.OP_GETATTR, nfs4.GETATTR4args([0x0010011A, 0x00B0A23A])),
        ],
    )
    assert pack(nfs4.enc_COMPOUND4args, args) == expected
    assert unpack(nfs4.dec_COMPOUND4args, expected) == args


def test_create_session() -> None:
    """RFC 5662: CREATE_SESSION4args with both channels' attributes and AUTH_SYS callbacks."""
    fore = words(0, 1049620, 1049480, 3428, 8, 64) + words(0)  # ca_rdma_ird<1> empty
    back = words(0, 4096, 4096, 0, 2, 1) + words(1, 5)  # ca_rdma_ird = [5]
    sys_parms = words(0) + words(2) + b"cb\x00\x00" + words(0, 0) + words(0)
    expected = (
        words(0x11223344, 0x55667788)  # csa_clientid (uint64)
        + words(1)  # csa_sequence
        + words(3)  # csa_flags: PERSIST | CONN_BACK_CHAN
        + fore
        + back
        + words(0x40000000)  # csa_cb_program
        + words(2)  # csa_sec_parms<> count
        + words(0)  # AUTH_NONE: void
        + words(1)
        + sys_parms  # AUTH_SYS: authsys_parms
    )
    args = nfs4.CREATE_SESSION4args(
        csa_clientid=0x1122334455667788,
        csa_sequence=1,
        csa_flags=nfs4.CREATE_SESSION4_FLAG_PERSIST | nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN,
        csa_fore_chan_attrs=nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 64, []),
        csa_back_chan_attrs=nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, [5]),
        csa_cb_program=0x40000000,
        csa_sec_parms=[
            nfs4.callback_sec_parms4(0, None),
            nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "cb", 0, 0, [])),
        ],
    )
    assert pack(nfs4.enc_CREATE_SESSION4args, args) == expected
    assert unpack(nfs4.dec_CREATE_SESSION4args, expected) == args
    # ca_rdma_ird holds at most one element (UL-33/UL-34).
    too_many = expected.replace(words(1, 5), words(2, 5, 6), 1)
    with pytest.raises(ValueError):
        unpack(nfs4.dec_CREATE_SESSION4args, too_many)


def test_rpc_rdma_header_with_all_three_chunk_lists() -> None:
    """RFC 8166 section 4: RDMA_MSG with a read list, a write list and a reply chunk."""
    expected = (
        words(0xCAFE, 1, 32, 0)  # xid, vers 1, credits 32, RDMA_MSG
        + words(1, 0x94)
        + words(0xAA01, 4096)
        + words(0, 0x10000)  # read: pos 148, seg
        + words(1, 0x94)
        + words(0xAA02, 100)
        + words(0, 0x11000)  # same chunk, 2nd seg
        + words(0)  # end of read list
        + words(1, 1)
        + words(0xBB01, 8192)
        + words(0x1, 0x20000)  # write chunk, 1 segment
        + words(0)  # end of write list
        + words(1, 2)  # reply chunk present, 2 segments
        + words(0xCC01, 1024)
        + words(0, 0x30000)
        + words(0xCC02, 1024)
        + words(0, 0x30400)
    )
    seg = rpcrdma.xdr_rdma_segment
    hdr = rpcrdma.rdma_msg(
        0xCAFE,
        1,
        32,
        rpcrdma.rdma_body(
            rpcrdma.RDMA_MSG,
            rpcrdma.rpc_rdma_header(
                rdma_reads=[
                    rpcrdma.xdr_read_chunk(0x94, seg(0xAA01, 4096, 0x10000)),
                    rpcrdma.xdr_read_chunk(0x94, seg(0xAA02, 100, 0x11000)),
                ],
                rdma_writes=[rpcrdma.xdr_write_chunk([seg(0xBB01, 8192, 0x100020000)])],
                rdma_reply=rpcrdma.xdr_write_chunk(
                    [seg(0xCC01, 1024, 0x30000), seg(0xCC02, 1024, 0x30400)]
                ),
            ),
        ),
    )
    assert pack(rpcrdma.enc_rdma_msg, hdr) == expected
    assert unpack(rpcrdma.dec_rdma_msg, expected) == hdr


def test_rdma_error_err_vers() -> None:
    """RFC 8166 section 4.5: RDMA_ERROR / ERR_VERS carries the supported range (TR-16)."""
    expected = words(0xBEEF, 1, 0, 4, 1, 1, 1)
    hdr = rpcrdma.rdma_msg(
        0xBEEF,
        1,
        0,
        rpcrdma.rdma_body(
            rpcrdma.RDMA_ERROR,
            rpcrdma.rpc_rdma_error(rpcrdma.ERR_VERS, rpcrdma.rpc_rdma_errvers(1, 1)),
        ),
    )
    assert pack(rpcrdma.enc_rdma_msg, hdr) == expected
    assert unpack(rpcrdma.dec_rdma_msg, expected) == hdr
    chunk = words(0xBEEF, 1, 0, 4, 2)
    assert unpack(rpcrdma.dec_rdma_msg, chunk).rdma_body.value == rpcrdma.rpc_rdma_error(
        rpcrdma.ERR_CHUNK, None
    )


def test_reply_header_layouts() -> None:
    """RFC 5531: accepted SUCCESS and PROG_MISMATCH, denied AUTH_ERROR."""
    w = Writer()
    message.encode_accepted(w, 7)
    assert bytes(w) == words(7, 1, 0, 0, 0, 0)
    w = Writer()
    message.encode_accepted(w, 7, rpc.PROG_MISMATCH, (2, 4))
    assert bytes(w) == words(7, 1, 0, 0, 0, 2, 2, 4)
    w = Writer()
    message.encode_denied(w, 7, auth=rpc.AUTH_TOOWEAK)
    assert bytes(w) == words(7, 1, 1, 1, 5)
