"""Record marking against hostile fragment streams (issue 9, hole 2): the marks count against the
record limit, a record has at most ``max_fragments`` fragments, and what the parser holds stays
bounded by the record limit however the stream is cut."""

from __future__ import annotations

import struct

import pytest

from nfsrdma.transport.tcp import (
    LAST_FRAGMENT,
    MAX_FRAGMENTS,
    RecordParser,
    RecordTooLarge,
    frame,
)

EMPTY_MARK = struct.pack(">I", 0)  # an empty, non-final fragment


def _mark(n: int, last: bool = False) -> bytes:
    return struct.pack(">I", (LAST_FRAGMENT if last else 0) | n)


def test_empty_fragments_are_cut_off_after_the_bound() -> None:
    parser = RecordParser()
    accepted = 0
    with pytest.raises(RecordTooLarge, match="fragments"):
        for _ in range(50_000_000):  # 200 MB of empty fragment marks, if nothing stopped them
            parser.feed(EMPTY_MARK)
            accepted += 1
            assert parser.buffered == 0  # an empty fragment leaves nothing behind
    # A record has at most MAX_FRAGMENTS fragments, the last one final.
    assert accepted == MAX_FRAGMENTS - 1
    # Fed in large chunks, the stream is cut off just the same.
    with pytest.raises(RecordTooLarge, match="fragments"):
        RecordParser().feed(EMPTY_MARK * 100_000)


def test_tiny_fragments_hold_no_more_than_their_payload() -> None:
    """Two-byte fragments: what is buffered is the payload itself (no 9x amplification by
    per-fragment objects), and the stream is cut off at the fragment bound."""
    parser = RecordParser(max_fragments=64)
    chunk = (_mark(2) + b"ab") * 16
    with pytest.raises(RecordTooLarge, match="64 fragments"):
        for _ in range(100):
            parser.feed(chunk)
            assert parser.buffered <= 2 * 64
    assert parser.buffered <= 2 * 64


def test_a_record_may_have_exactly_max_fragments() -> None:
    parser = RecordParser(max_fragments=4)
    stream = _mark(1) + b"a" + _mark(1) + b"b" + _mark(1) + b"c" + _mark(1, last=True) + b"d"
    assert parser.feed(stream) == [b"abcd"]
    assert parser.buffered == 0 and not parser.in_record
    with pytest.raises(RecordTooLarge):
        parser.feed(_mark(1) + b"a" + _mark(1) + b"b" + _mark(1) + b"c" + _mark(1) + b"d")


def test_marks_count_against_the_record_limit() -> None:
    # One fragment of exactly the limit is a valid record ...
    assert RecordParser(100).feed(_mark(100, last=True) + b"x" * 100) == [b"x" * 100]
    # ... the same payload in two fragments costs one more mark, and is too large.
    parser = RecordParser(100)
    with pytest.raises(RecordTooLarge, match="marks included"):
        parser.feed(_mark(50) + b"x" * 50 + _mark(50, last=True) + b"x" * 50)
    # Empty fragments alone exhaust a small limit (4 bytes each after the first).
    parser = RecordParser(100, max_fragments=1000)
    with pytest.raises(RecordTooLarge, match="marks included"):
        parser.feed(EMPTY_MARK * 30)


def test_the_limit_is_checked_before_the_fragment_arrives() -> None:
    parser = RecordParser(1000)
    with pytest.raises(RecordTooLarge):
        parser.feed(_mark(0x7FFFFFFF))
    assert parser.buffered <= 4


def test_reset_releases_what_is_buffered() -> None:
    parser = RecordParser()
    parser.feed(_mark(10) + b"0123456789" + _mark(100, last=True) + b"partial")
    assert parser.in_record and parser.buffered == 10 + 4 + 7
    parser.reset()
    assert parser.buffered == 0 and not parser.in_record
    assert parser.feed(b"".join(bytes(p) for p in frame([b"next"]))) == [b"next"]


def test_in_record_from_the_first_byte() -> None:
    parser = RecordParser()
    assert not parser.in_record
    parser.feed(b"\x80")
    assert parser.in_record
    parser.feed(b"\x00\x00\x01")
    assert parser.in_record
    assert parser.feed(b"z") == [b"z"]
    assert not parser.in_record


def test_one_whole_record_per_receive_keeps_every_rule() -> None:
    """A receive holding exactly one whole record (the usual case, taken without the general
    loop) gives the same records and refusals as any other way of cutting the stream."""
    p = RecordParser(max_record=100)
    assert p.feed(_mark(100, True) + b"a" * 100) == [b"a" * 100]
    assert p.feed(_mark(0, True)) == [b""]
    assert not p.in_record and p.buffered == 0
    # A first fragment that is whole but not last waits for the rest.
    assert p.feed(_mark(10, False) + b"b" * 10) == []
    assert p.feed(_mark(5, True) + b"c" * 5) == [b"b" * 10 + b"c" * 5]
    # Too large, even when it all came at once.
    with pytest.raises(RecordTooLarge):
        RecordParser(max_record=100).feed(_mark(101, True) + b"d" * 101)
    # The whole record after an incomplete one belongs to the stream, not to a new record.
    q = RecordParser()
    assert q.feed(_mark(4, True) + b"ab") == []
    assert q.feed(b"cd" + _mark(2, True) + b"ef") == [b"abcd", b"ef"]
