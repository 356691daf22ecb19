"""Checking the placement items of a received XMTREQ or XMTRESP (RT-12, RT-13, RT-18), sans-IO
and table-driven.

Table 1 of the draft says where each placement type may appear. The XDR of ``xmdp_loc``
already rejects CHOICE and BYSIZE (directions only); the table below rejects TOOSHORT and NOITEM
in a request (answers to reply directions, so only in a response). A Table 1 violation makes
the header unusable as a whole and is answered like an XDR error in it: RDMA_ERROR with
ERR_CHUNK (RT-18: REPTERR is only for semantic and grouping errors). The semantic checks that
follow give REPTERR codes:

- BADOFF: an item's position in the virtual XDR stream (``xmdmi_disp``) not 4-aligned, before
  the previous item's, or past the end of the stream (payload plus the items before it); or a TBSN offset into the first
  target segment not 4-aligned or not inside a receive segment;
- BADTBSN: a target-segment number outside the placement-capable (PLT) segments of the group
  (RT-14). This implementation advertises no PLT segments (phase 1), so every TBSN target is
  out of range: the range is then reported empty, as ``min = 1, max = 0``.

The ``(value, min, max)`` reported follows the draft: a value inside ``[min, max]`` means the
problem is its alignment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from nfsrdma.xdr.gen import rpcrdma as x

_T = x.xmdp_type
E = x.optr_err
TABLE1_VIOLATION: Final = 0  # not a REPTERR code: answered with RDMA_ERROR / ERR_CHUNK


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of Table 1: where the placement type is valid."""

    request_loc: bool  # as an xmdp_loc in a request's items
    response_loc: bool  # as an xmdp_loc in a response's items
    direction: bool  # as a reply direction's location (xmdp_rsdloc); we send none


TABLE1: Final[dict[int, Rule]] = {
    _T.XMPTYPE_EXRW: Rule(True, True, True),
    _T.XMPTYPE_TBSN: Rule(True, True, True),
    _T.XMPTYPE_CHOICE: Rule(False, False, True),
    _T.XMPTYPE_BYSIZE: Rule(False, False, True),
    _T.XMPTYPE_TOOSHORT: Rule(False, True, False),
    _T.XMPTYPE_NOITEM: Rule(False, True, False),
}


def valid_in_loc(ptype: int, *, request: bool) -> bool:
    """Table 1: whether ``ptype`` may be an xmdp_loc of a request (or of a response)."""
    rule = TABLE1.get(ptype)
    if rule is None:
        return False
    return rule.request_loc if request else rule.response_loc


@dataclass(frozen=True, slots=True)
class Violation:
    """What is wrong with the items: a REPTERR code (or TABLE1_VIOLATION) and its details."""

    code: int
    why: str
    value_range: tuple[int, int, int] | None = None

    @property
    def repterr(self) -> bool:
        return self.code != TABLE1_VIOLATION


@dataclass(frozen=True, slots=True)
class Context:
    """What the receiver knows when it checks a group's items."""

    request: bool  # the items of an XMTREQ (else of an XMTRESP)
    payload: int  # octets of payload the group carried
    segment_size: int  # each receive buffer's segment
    plt_segments: int  # placement-capable segments in the whole group (RT-14)


def _exrw(item: x.xmdp_mitem, ctx: Context) -> Violation | None:
    segs = item.xmdmi_where.value
    assert isinstance(segs, list)
    if not segs or sum(s.length for s in segs) != item.xmdmi_length:
        return Violation(TABLE1_VIOLATION, "EXRW segments do not add up to the item length")
    return None


def _tbsn(item: x.xmdp_mitem, ctx: Context) -> Violation | None:
    loc = item.xmdmi_where.value
    assert isinstance(loc, x.xmdp_tbsnloc)
    hi = ctx.segment_size - 4
    if loc.xmdl_offset % 4 or not 0 <= loc.xmdl_offset <= hi:
        return Violation(E.OPTRERR_BADOFF, "TBSN offset", (loc.xmdl_offset, 0, max(0, hi)))
    lo, top = (0, ctx.plt_segments - 1) if ctx.plt_segments else (1, 0)
    for n in loc.xmdl_bsnum or [0xFFFFFFFF]:  # no target at all is no valid target
        if not lo <= n <= top:
            return Violation(E.OPTRERR_BADTBSN, "target segment number", (n, lo, top))
    return None


def _nothing(item: x.xmdp_mitem, ctx: Context) -> Violation | None:
    return None


_CHECKS: Final[dict[int, Callable[[x.xmdp_mitem, Context], Violation | None]]] = {
    _T.XMPTYPE_EXRW: _exrw,
    _T.XMPTYPE_TBSN: _tbsn,
    _T.XMPTYPE_TOOSHORT: _nothing,
    _T.XMPTYPE_NOITEM: _nothing,
}


def check_items(items: Sequence[x.xmdp_mitem], ctx: Context) -> Violation | None:
    """The first thing wrong with a group's placement items, or None (RT-12, RT-13)."""
    end = 0  # the previous item's position: positions never go back
    excised = 0  # octets the items before took in the virtual stream, with XDR padding
    for item in items:
        ptype = int(item.xmdmi_where.xmdl_type)
        if not valid_in_loc(ptype, request=ctx.request):
            where = "request" if ctx.request else "response"
            return Violation(TABLE1_VIOLATION, f"placement type {ptype} in a {where} (Table 1)")
        disp = item.xmdmi_disp
        top = ctx.payload + excised
        if disp % 4 or not end <= disp <= top:
            return Violation(E.OPTRERR_BADOFF, "item position", (disp, end, top))
        problem = _CHECKS[ptype](item, ctx)
        if problem is not None:
            return problem
        end = disp
        excised += -(-item.xmdmi_length // 4) * 4
    return None
