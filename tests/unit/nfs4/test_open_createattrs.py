"""OPEN's createattrs (RFC 8881 section 18.16.3): the mode alone, as the Linux client sends
them, is decoded in place (``open_close.createattrs``); every answer and error must be
``decode_settable``'s, the reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.nfs4.attrs import SUPPATTR_EXCLCREAT, attr_numbers, bitmap_of, decode_settable
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.nfs4.ops.open_close import createattrs
from nfsrdma.xdr.gen import nfs4

_MODE = bitmap_of([nfs4.FATTR4_MODE])
_MASKS = st.one_of(
    st.just(_MODE),
    st.just([*_MODE, 0]),  # (a trailing empty word: the same attributes)
    st.just([2]),
    st.just([]),
    st.just(bitmap_of([nfs4.FATTR4_MODE, nfs4.FATTR4_SIZE])),
    st.just(bitmap_of([nfs4.FATTR4_SIZE])),
    st.lists(st.integers(0, 2**32 - 1), max_size=3),
)
_VALUES = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda v: v.to_bytes(4, "big")),
    st.integers(0, 0o7777).map(lambda v: v.to_bytes(4, "big")),
    st.binary(max_size=12),
)


def _outcome(call: object, fattr: nfs4.fattr4) -> object:
    try:
        return call(fattr)  # type: ignore[operator]
    except Nfs4Error as e:
        return ("error", e.status)
    except Exception as e:
        return ("error", type(e))


@settings(max_examples=500, deadline=None)
@given(_MASKS, _VALUES)
def test_createattrs_are_decode_settable(mask: list[int], vals: bytes) -> None:
    fattr = nfs4.fattr4(mask, vals)
    mine = _outcome(createattrs, fattr)
    want = _outcome(decode_settable, fattr)
    if isinstance(mine, tuple) and mine[0] == "error":
        assert mine == want
        return
    settable, mode_only = mine  # type: ignore[misc]
    assert settable == want
    if mode_only:  # (what an exclusive create may set)
        assert attr_numbers(settable.attrset) == [nfs4.FATTR4_MODE]
        assert all(n in SUPPATTR_EXCLCREAT for n in attr_numbers(settable.attrset))


def test_the_linux_clients_mode_is_decoded_in_place() -> None:
    settable, mode_only = createattrs(nfs4.fattr4(_MODE, (0o644).to_bytes(4, "big")))
    assert mode_only and settable.mode == 0o644 and settable.attrset == _MODE
    # a mode with bits beyond 07777: the reference's NFS4ERR_INVAL
    assert _outcome(createattrs, nfs4.fattr4(_MODE, (0o10000).to_bytes(4, "big"))) == (
        "error",
        nfs4.NFS4ERR_INVAL,
    )
