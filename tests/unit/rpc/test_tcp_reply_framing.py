"""``TcpConnection.send_reply`` frames the usual replies itself (no DDP item, or one: a READ's
data) without ``_framed``; ``frame(msg.pieces())``, what ``_framed`` sends, is the reference:
the same pieces, in the same order, for random replies, DDP items and fragment sizes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nfsrdma.transport.tcp import TcpConnection, frame
from nfsrdma.xdr.runtime import DdpItem, Writer


class _Transport:
    def __init__(self) -> None:
        self.written: list[list[bytes]] = []

    def writelines(self, pieces: list[Any]) -> None:
        self.written.append([bytes(p) for p in pieces])

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


@st.composite
def _replies(draw: st.DrawFn) -> Writer:
    w = Writer(draw(st.binary(min_size=4, max_size=64)))
    for _ in range(draw(st.integers(0, 3))):
        w += draw(st.binary(max_size=16))
        w.ddp.append(DdpItem(len(w), draw(st.binary(max_size=40)), 0))
    w += draw(st.binary(max_size=16))
    return w


@settings(max_examples=300, deadline=None)
@given(msg=_replies(), max_fragment=st.integers(8, 200))
def test_send_reply_frames_as_framed_does(msg: Writer, max_fragment: int) -> None:
    conn = TcpConnection("test:1")
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.max_fragment = max_fragment
    conn.send_reply(None, msg)  # type: ignore[arg-type]
    want = [bytes(p) for p in frame(msg.pieces(), max_fragment)]
    assert transport.written == [want]


def test_a_read_reply_is_framed_without_framed(monkeypatch: Any) -> None:
    """A reply with one DDP item within a fragment does not go through ``_framed``."""
    conn = TcpConnection("test:1")
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]

    def framed(*args: object) -> None:
        raise AssertionError("_framed called")

    monkeypatch.setattr(conn, "_framed", framed)
    msg = Writer(bytes(12))
    msg.ddp.append(DdpItem(len(msg), b"abcde", 0))
    msg += bytes(8)
    conn.send_reply(None, msg)  # type: ignore[arg-type]
    assert transport.written == [
        [(0x80000000 | 28).to_bytes(4, "big"), bytes(12), b"abcde", b"\0\0\0", bytes(8)]
    ]
