"""The client's back channel (RFC 8881 2.10.6 on the back channel, 20.2, 20.8; UL-22)."""

from __future__ import annotations

from nfsrdma.session.client_backchannel import Backchannel, CallbackEvents, Recall
from nfsrdma.session.client_callbacks import recalls_of
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer

SID = b"S" * 16
STATEID = nfs4.stateid4(1, b"D" * 12)


def cb(*ops: nfs4.nfs_cb_argop4, minor: int = 1) -> Reader:
    w = Writer()
    nfs4.enc_CB_COMPOUND4args(w, nfs4.CB_COMPOUND4args(b"t", minor, 0, list(ops)))
    return Reader(w.flatten())


def seq(seqid: int, slot: int = 0, sid: bytes = SID, cachethis: bool = True) -> nfs4.nfs_cb_argop4:
    return nfs4.nfs_cb_argop4(
        nfs4.OP_CB_SEQUENCE, nfs4.CB_SEQUENCE4args(sid, seqid, slot, 0, cachethis, [])
    )


def recall() -> nfs4.nfs_cb_argop4:
    return nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL, nfs4.CB_RECALL4args(STATEID, False, b"fh"))


def test_recall_is_acknowledged_and_reported() -> None:
    bc = Backchannel(SID, 2)
    res, ev = bc.handle(cb(seq(1), recall()), 0)
    assert res.status == nfs4.NFS4_OK
    assert [r.resop for r in res.resarray] == [nfs4.OP_CB_SEQUENCE, nfs4.OP_CB_RECALL]
    ok = res.resarray[0].value
    assert isinstance(ok, nfs4.CB_SEQUENCE4res) and ok.value is not None
    assert (ok.value.csr_sequenceid, ok.value.csr_highest_slotid) == (1, 1)
    assert len(ev.recalls) == 1 and ev.recalls[0].stateid == STATEID and ev.recalls[0].fh == b"fh"


def test_replay_gets_the_cached_reply_without_new_events() -> None:
    bc = Backchannel(SID, 1)
    first, _ = bc.handle(cb(seq(1), recall()), 0)
    again, ev = bc.handle(cb(seq(1), recall()), 0)
    assert again is first and not ev


def test_uncached_replay_answers_retry_uncached_rep() -> None:
    bc = Backchannel(SID, 1)
    bc.handle(cb(seq(1, cachethis=False), recall()), 0)
    res, ev = bc.handle(cb(seq(1, cachethis=False), recall()), 0)
    assert res.status == nfs4.NFS4ERR_RETRY_UNCACHED_REP and not ev


def test_sequence_errors() -> None:
    bc = Backchannel(SID, 1)
    res, _ = bc.handle(cb(seq(2), recall()), 0)
    assert res.status == nfs4.NFS4ERR_SEQ_MISORDERED and len(res.resarray) == 1
    res, _ = bc.handle(cb(seq(1, slot=5)), 0)
    assert res.status == nfs4.NFS4ERR_BADSLOT
    res, _ = bc.handle(cb(seq(1, sid=b"X" * 16)), 0)
    assert res.status == nfs4.NFS4ERR_BADSESSION
    res, _ = bc.handle(cb(recall()), 0)
    assert res.status == nfs4.NFS4ERR_OP_NOT_IN_SESSION
    res, _ = bc.handle(cb(seq(1), seq(2)), 0)
    assert res.status == nfs4.NFS4ERR_SEQUENCE_POS
    res, _ = bc.handle(cb(seq(1), minor=0), 0)
    assert res.status == nfs4.NFS4ERR_MINOR_VERS_MISMATCH


def test_recall_slot_and_unsupported_callbacks() -> None:
    bc = Backchannel(SID, 1)
    res, ev = bc.handle(
        cb(seq(1), nfs4.nfs_cb_argop4(nfs4.OP_CB_RECALL_SLOT, nfs4.CB_RECALL_SLOT4args(3))), 0
    )
    assert res.status == nfs4.NFS4_OK and ev.recall_slot == 3
    getattr_op = nfs4.nfs_cb_argop4(nfs4.OP_CB_GETATTR, nfs4.CB_GETATTR4args(b"fh", []))
    res, ev = bc.handle(cb(seq(2), getattr_op), 0)
    assert res.status == nfs4.NFS4ERR_NOTSUPP and not ev


def test_recall_any_returns_every_delegation_held() -> None:
    """RFC 8881 20.6: CB_RECALL_ANY; what to give back is decided without I/O."""
    other = nfs4.stateid4(1, b"E" * 12)
    held = {STATEID.other: (STATEID, b"fh"), other.other: (other, b"fh2")}
    events = CallbackEvents(recalls=[Recall(STATEID, b"fh", False)])
    assert [r.stateid for r in recalls_of(events, held)] == [STATEID]
    events.recall_any = True
    assert {r.stateid.other for r in recalls_of(events, held)} == set(held)
