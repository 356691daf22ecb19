"""The TCP receive path (``RecordReceiver``, records decoded in the buffers bytes are received
into) against the reference ``RecordParser``: the same records and the same RecordTooLarge
(RFC 5531 section 11 record marking; a record above the limit, marks after the first counted,
or with too many fragments, ends the connection: RPC-6/TR record rules) on any split of the
byte stream, with marks at every position, hostile marks (huge, zero-length, too many
fragments) and fragments on both sides of the direct-receive threshold."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfsrdma.transport.tcp import RecordParser, RecordTooLarge, frame
from nfsrdma.transport.tcp_receive import LAST_FRAGMENT, LargeBuffers, RecordReceiver


def _mark(n: int, last: bool = False) -> bytes:
    return struct.pack(">I", (LAST_FRAGMENT if last else 0) | n)


def reference(stream: bytes, max_record: int, max_fragments: int) -> tuple[list[bytes], bool]:
    """The parser's records, one byte at a time (every record before an error), and whether
    the stream ends in RecordTooLarge."""
    p = RecordParser(max_record, max_fragments)
    out: list[bytes] = []
    for i in range(len(stream)):
        try:
            out += p.feed(stream[i : i + 1])
        except RecordTooLarge:
            return out, True
    return out, False


def receive(
    rx: RecordReceiver, stream: bytes, sizes: list[int]
) -> tuple[list[bytes | bytearray], bool]:
    """Receive ``stream`` as a socket would: each receive fills at most the buffer lent and at
    most the next of ``sizes`` (cycled) bytes."""
    out: list[bytes | bytearray] = []
    pos = i = 0
    while pos < len(stream):
        buf = rx.get_buffer()
        assert len(buf) > 0  # a receive always has room
        k = min(len(buf), sizes[i % len(sizes)], len(stream) - pos)
        i += 1
        buf[:k] = stream[pos : pos + k]
        pos += k
        try:
            out += rx.received(k)
        except RecordTooLarge:
            return out, True
    return out, False


def _check(
    stream: bytes,
    sizes: list[int],
    max_record: int,
    max_fragments: int,
    buffer_size: int,
    threshold: int,
) -> None:
    want, fails = reference(stream, max_record, max_fragments)
    rx = RecordReceiver(
        max_record, max_fragments, buffer_size=buffer_size, direct_threshold=threshold
    )
    got, failed = receive(rx, stream, sizes)
    assert failed == fails
    if fails:  # records completed in the receive that failed are not delivered
        assert [bytes(r) for r in got] == want[: len(got)]
    else:
        assert [bytes(r) for r in got] == want
        p = RecordParser(max_record, max_fragments)
        p.feed(stream)
        assert rx.in_record == p.in_record
        assert rx.buffered == p.buffered


@st.composite
def framed_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """Well-formed streams: records of sizes around the threshold, in fragments."""
    threshold = draw(st.integers(0, 60))
    n = draw(st.integers(1, 6))
    parts: list[bytes] = []
    for _ in range(n):
        size = draw(st.integers(0, 3 * threshold + 8))
        body = bytes(draw(st.integers(0, 255)) for _ in range(min(size, 4))) * (size // 4 + 1)
        frag = draw(st.integers(1, max(1, size + 1)))
        parts += [bytes(p) for p in frame([body[:size]], max_fragment=frag)]
    return b"".join(parts), threshold


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    framed_streams(),
    st.lists(st.integers(1, 300), min_size=1, max_size=8),
    st.integers(0, 30),
    st.one_of(st.just(1 << 20), st.integers(0, 200)),
    st.sampled_from([1024, 1, 2, 3]),
)
def test_well_formed_streams_on_any_split(
    streamed: tuple[bytes, int], sizes: list[int], spare: int, limit: int, max_fragments: int
) -> None:
    """(With a record limit or fragment count that some of the records exceed, too.)"""
    stream, threshold = streamed
    _check(stream, sizes, limit, max_fragments, threshold + 4 + spare, threshold)


@st.composite
def hostile_streams(draw: st.DrawFn) -> bytes:
    """Marks of any length (huge, zero, just around the limits), last or not, with or without
    the bytes they announce, and raw garbage between."""
    out = b""
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["mark", "frag", "raw", "empty"]))
        last = draw(st.booleans())
        if kind == "mark":
            n = draw(st.sampled_from([0x7FFFFFFF, 1 << 20, 101, 100, 99, 61, 60, 59, 3, 0]))
            out += _mark(n, last)
        elif kind == "frag":
            n = draw(st.integers(0, 120))
            out += _mark(n, last) + b"\xaa" * n
        elif kind == "empty":
            out += _mark(0, last) * draw(st.integers(1, 10))
        else:
            out += draw(st.binary(max_size=40))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hostile_streams(),
    st.lists(st.integers(1, 64), min_size=1, max_size=6),
    st.integers(0, 60),
    st.integers(1, 6),
)
def test_hostile_marks_on_any_split(
    stream: bytes, sizes: list[int], threshold: int, max_fragments: int
) -> None:
    _check(stream, sizes, 100, max_fragments, threshold + 4 + 8, threshold)


@pytest.mark.parametrize("split", [1, 2, 3, 4, 5, 7, 64, 1 << 16])
def test_the_threshold_boundary(split: int) -> None:
    """A fragment of exactly the threshold waits in the shared buffer; one byte more is
    received into a buffer of its own, which is the record handed on."""
    threshold = 32
    stream = _mark(threshold, True) + b"a" * threshold + _mark(threshold + 1, True)
    stream += b"b" * (threshold + 1) + _mark(0, True)
    _check(stream, [split], 1 << 20, 8, threshold + 4, threshold)
    rx = RecordReceiver(1 << 20, 8, buffer_size=threshold + 4, direct_threshold=threshold)
    got, failed = receive(rx, stream, [split])
    assert not failed
    assert got == [b"a" * threshold, b"b" * (threshold + 1), b""]
    assert type(got[0]) is bytes  # copied out of the shared buffer
    assert type(got[1]) is bytearray  # the buffer it was received into, when it came in parts
    assert split >= len(stream) or not rx.in_record


def test_a_large_record_is_the_buffer_it_was_received_into() -> None:
    """What already arrived is copied once; the rest lands in the record's own buffer."""
    size = 1 << 20
    body = bytes(range(256)) * (size // 256)
    stream = _mark(size, True) + body
    rx = RecordReceiver(4 << 20, 1024)
    first = rx.get_buffer()
    first[:1000] = stream[:1000]
    assert rx.received(1000) == []
    assert not rx.receiving_direct  # a mark alone does not make us hold a megabyte
    more = rx.get_buffer()
    more[:] = stream[1000 : 1000 + len(more)]
    assert rx.received(len(more)) == []
    assert rx.receiving_direct and rx.buffered == len(first)  # the shared buffer, copied once
    lent: list[memoryview] = []
    pos = len(first)
    records: list[bytes | bytearray] = []
    while pos < len(stream):
        buf = rx.get_buffer()
        lent.append(buf)
        k = min(len(buf), 200_000)
        buf[:k] = stream[pos : pos + k]
        pos += k
        records += rx.received(k)
    assert records == [body]
    assert all(b.obj is records[0] for b in lent)  # every receive went into the record itself
    assert not rx.in_record and rx.buffered == 0
    assert rx.get_buffer().obj is first.obj  # and the shared buffer is used again


def test_a_mark_alone_does_not_make_the_receiver_hold_more() -> None:
    """A hostile peer announcing a large fragment and sending little of it: the receiver holds
    what was sent (in the shared buffer) until a buffer's worth has arrived."""
    rx = RecordReceiver(4 << 20, 1024, buffer_size=1024, direct_threshold=512)
    receive(rx, _mark(4 << 20, True) + b"z" * 1019, [100])
    assert not rx.receiving_direct and rx.buffered == 1023
    receive(rx, b"z", [1])
    assert rx.receiving_direct and rx.buffered == 1024


def test_limits_are_checked_before_any_buffer_is_made() -> None:
    rx = RecordReceiver(1000, 4)
    buf = rx.get_buffer()
    buf[:4] = _mark(0x7FFFFFFF)
    with pytest.raises(RecordTooLarge):
        rx.received(4)
    rx = RecordReceiver(4 << 20, 1024)
    buf = rx.get_buffer()
    buf[:4] = _mark((4 << 20) + 1, True)
    with pytest.raises(RecordTooLarge):
        rx.received(4)
    assert not rx.receiving_direct


def test_a_direct_fragment_counts_against_the_record_limit() -> None:
    rx = RecordReceiver(100, 8, buffer_size=20, direct_threshold=8)
    stream = _mark(60) + b"x" * 60 + _mark(37, True) + b"y" * 37
    assert receive(rx, stream, [10]) == ([], True)  # 60 + 4 + 37 > 100: refused


def test_reset_drops_a_direct_receive() -> None:
    rx = RecordReceiver(4 << 20, 1024)
    buf = rx.get_buffer()
    buf[:] = (_mark(100_000, True) + b"abcd" * 10_000)[: len(buf)]
    rx.received(len(buf))
    assert rx.receiving_direct and rx.in_record
    rx.reset()
    assert not rx.in_record and rx.buffered == 0
    stream = b"".join(bytes(p) for p in frame([b"next"]))
    assert rx.feed(stream) == [b"next"]


def test_the_threshold_must_fit_the_buffer() -> None:
    with pytest.raises(ValueError):
        RecordReceiver(1 << 20, 8, buffer_size=100, direct_threshold=97)
    with pytest.raises(ValueError):
        RecordReceiver(1 << 20, 0)


def _large(rx: RecordReceiver, body: bytes) -> bytes | bytearray:
    """Receive one record of ``body`` in 64 KiB receives; the record."""
    got, failed = receive(rx, _mark(len(body), True) + body, [1 << 16])
    assert not failed and len(got) == 1
    return got[0]


def test_a_large_record_buffer_is_reused_only_once_nothing_refers_to_it() -> None:
    """A large record's buffer is received into again for a record of its size once the
    record and every view of it are gone; never while anything still refers to it (the
    record, a memoryview of it, a slice of that view), so nothing held is overwritten."""
    size = 300_000
    rx = RecordReceiver(4 << 20, 1024)
    first = _large(rx, b"a" * size)
    kept = id(first)
    view = memoryview(first)[100:200]  # e.g. WRITE data still being written
    del first
    second = _large(rx, b"b" * size)
    assert id(second) != kept and bytes(view) == b"a" * 100  # the view's octets untouched
    third = _large(rx, b"c" * (size + 1))  # another size: never that buffer
    assert bytes(view) == b"a" * 100 and bytes(third) == b"c" * (size + 1)
    del view
    fourth = _large(rx, b"d" * size)
    assert id(fourth) == kept and fourth == b"d" * size  # the first record's buffer, reused
    assert second == b"b" * size
    assert rx.large.reused == 1


def test_listener_connections_share_the_large_buffers() -> None:
    """The receivers of one listener's connections share one LargeBuffers: a buffer one
    connection's record used serves another connection's record of the same size later."""
    shared = LargeBuffers()
    a = RecordReceiver(4 << 20, 1024, large=shared)
    b = RecordReceiver(4 << 20, 1024, large=shared)
    rec = _large(a, b"x" * 100_000)
    kept = id(rec)
    del rec
    assert id(_large(b, b"y" * 100_000)) == kept and shared.reused == 1


def test_large_buffers_kept_within_their_limit() -> None:
    large = LargeBuffers(keep_bytes=250_000)
    rx = RecordReceiver(4 << 20, 1024, large=large)
    records = [_large(rx, bytes([i]) * 100_000) for i in range(4)]
    assert large._bytes == 200_000 and len(large._bufs) == 2  # the two newest
    del records
    assert _large(rx, b"z" * 100_000) == b"z" * 100_000 and large.reused == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from([9_000, 20_000, 20_001]), st.booleans()), max_size=12),
    st.lists(st.integers(1, 9_000), min_size=1, max_size=6),
)
def test_reused_buffers_never_change_a_record_still_held(
    plan: list[tuple[int, bool]], sizes: list[int]
) -> None:
    """Large records of a few sizes, each either held to the end or dropped at once, on any
    split: every record delivered is what was sent, and those held are unchanged at the end
    while later ones were received (some into reused buffers)."""
    rx = RecordReceiver(1 << 20, 8, buffer_size=4096, direct_threshold=1024)
    held: list[tuple[bytes | bytearray, bytes]] = []
    for i, (size, hold) in enumerate(plan):
        body = bytes([i % 251]) * size
        got, failed = receive(rx, _mark(size, True) + body, sizes)
        assert not failed and got == [body]
        if hold:
            held.append((got[0], body))
        del got
    assert all(rec == body for rec, body in held)
