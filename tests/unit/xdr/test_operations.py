"""The generated operation tables and COMPOUND header peeks agree with the union codecs they
are written from (RFC 8881 section 16.2: COMPOUND4args / nfs_argop4 / nfs_resop4)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Operation, Reader, Writer, XdrError, pack
from tests.unit.xdr.test_generated import STRATEGIES

NFS4 = STRATEGIES["nfs4"]
TABLES: list[tuple[dict[int, Operation[Any, Any]], str, str]] = [
    (nfs4.OPERATIONS, "nfs_argop4", "nfs_resop4"),
    (nfs4.CB_OPERATIONS, "nfs_cb_argop4", "nfs_cb_resop4"),
]


@pytest.mark.parametrize(("table", "args", "results"), TABLES)
def test_every_case_of_both_unions_has_its_operation(
    table: dict[int, Operation[Any, Any]], args: str, results: str
) -> None:
    arg_cases = set(getattr(nfs4, f"_{args}_DEC"))
    res_cases = set(getattr(nfs4, f"_{results}_DEC"))
    assert set(table) == arg_cases & res_cases
    for number, op in table.items():
        assert op.number == number
        assert op.name == op.number.name  # the enum member's name


def test_operation_names_and_void_arguments() -> None:
    assert nfs4.OPERATIONS[nfs4.OP_READ] is nfs4.OPERATION_READ
    assert nfs4.OPERATION_READ.name == "OP_READ"
    assert nfs4.OPERATION_READ.has_args and not nfs4.OPERATION_GETFH.has_args
    assert nfs4.OPERATION_GETFH.dec_args(Reader(b""), 0) == (None, 0)
    assert nfs4.CB_OPERATION_RECALL.number == nfs4.OP_CB_RECALL


@settings(max_examples=300, deadline=None)
@given(data=st.data(), cb=st.booleans())
def test_operations_code_as_the_unions_do(data: st.DataObject, cb: bool) -> None:
    table, args, results = TABLES[cb]
    argop = data.draw(NFS4.for_type(args))
    wire = pack(getattr(nfs4, f"enc_{args}"), argop)
    number = int.from_bytes(wire[:4], "big")
    op = table.get(number)
    if op is None:  # a case of one union only
        return
    value, end = op.dec_args(Reader(wire), 4)
    assert (value, end) == (argop.value, len(wire))
    w = Writer()
    op.enc_args(w, value)
    assert w.flatten() == wire[4:]

    resop = data.draw(NFS4.for_type(results))
    op = table.get(int(resop.resop))
    if op is None:
        return
    w = Writer()
    op.encode_result(w, resop.value)
    assert w.flatten() == pack(getattr(nfs4, f"enc_{results}"), resop)
    first = resop.value.__dataclass_fields__  # the status: first field or discriminant
    assert op.status_of(resop.value) == getattr(resop.value, next(iter(first)))


@pytest.mark.parametrize("op", list(nfs4.OPERATIONS.values()), ids=lambda o: o.name)
def test_error_results_encode_with_their_status(op: Operation[Any, Any]) -> None:
    res = op.error(nfs4.NFS4ERR_NOTSUPP)
    assert op.status_of(res) == nfs4.NFS4ERR_NOTSUPP
    w = Writer()
    op.encode_result(w, res)
    decoded, end = nfs4.dec_nfs_resop4(Reader(w.flatten()), 0)
    assert end == len(w) and decoded.resop == op.number
    assert op.status_of(decoded.value) == nfs4.NFS4ERR_NOTSUPP


@settings(max_examples=200, deadline=None)
@given(args=NFS4.for_type("COMPOUND4args"))
def test_peek_reads_the_compound_header_only(args: nfs4.COMPOUND4args) -> None:
    wire = pack(nfs4.enc_COMPOUND4args, args)
    head, off = nfs4.peek_COMPOUND4args(Reader(wire), 0)
    assert (head.tag, head.minorversion, head.argarray) == (
        args.tag,
        args.minorversion,
        len(args.argarray),
    )
    # The operations start right there.
    for argop in args.argarray:
        one = pack(nfs4.enc_nfs_argop4, argop)
        assert wire[off : off + len(one)] == one
        off += len(one)
    assert off == len(wire)


def test_peek_of_a_truncated_header_is_an_xdr_error() -> None:
    wire = pack(nfs4.enc_COMPOUND4args, nfs4.COMPOUND4args(b"tag", 1, []))
    for cut in range(1, len(wire)):
        with pytest.raises(XdrError):
            nfs4.peek_COMPOUND4args(Reader(wire[:cut]), 0)
    head, _ = nfs4.peek_CB_COMPOUND4args(
        Reader(pack(nfs4.enc_CB_COMPOUND4args, nfs4.CB_COMPOUND4args(b"", 1, 7, []))), 0
    )
    assert (head.minorversion, head.callback_ident, head.argarray) == (1, 7, 0)
