"""Record marking (RFC 5531 section 11) decoded in the buffers the bytes are received into.

``RecordReceiver`` is the sans-IO core of ``TcpConnection``'s receive path (an
``asyncio.BufferedProtocol``): the event loop asks it for a buffer (``get_buffer``), receives
into it, and reports how many bytes arrived (``received``), which returns the records they
complete. Its rules are ``RecordParser``'s, which stays the reference (``tcp.py``): the same
records, the same ``RecordTooLarge`` for a record above ``max_record`` (marks after the first
counted) or with more than ``max_fragments`` fragments, checked at each mark before its
fragment arrives, on any split of the byte stream.

Ordinary records are received into one small buffer of ``buffer_size`` bytes that is reused;
each is copied out of it once (as ``bytes``), so nothing downstream keeps a view of it. When a
fragment larger than ``direct_threshold`` has filled the rest of that buffer without ending
there, a buffer of the fragment's size is made, what already arrived of it is copied there
once, and the rest is received straight into it (a peer must send a buffer's worth of a
fragment before its mark makes us hold more; never more than the record limit): a one-fragment record (Linux's 1 MiB WRITE, our client's 1 MiB
READ reply) is then handed on as that buffer (a ``bytearray`` never reused), and the decoded
WRITE data is a view of it, written to the file with no copy in Python. Fragments of a
record of several are gathered into one buffer, as ``RecordParser`` does.

The buffers of large fragments are reused (``LargeBuffers``, which a listener shares between
its connections): a fragment is received into a buffer of its size handed on before, once
nothing else refers to it any more (the record and every view of it are gone:
``sys.getrefcount``), instead of a new ``bytearray``, which Python fills with zeros first (as
much work as the receive's own copy) and the allocator may have to fault in. Its old contents
are overwritten by the fragment before anyone sees the buffer again.
"""

from __future__ import annotations

import struct
import sys

LAST_FRAGMENT = 0x80000000
MAX_FRAGMENT = 0x7FFFFFFF
MARK_SIZE = 4
RECEIVE_BUFFER = 32 << 10  # the reused buffer for ordinary records (per connection)
DIRECT_THRESHOLD = 8 << 10  # an incomplete fragment above this gets a buffer of its own
LARGE_BUFFERS_KEPT = 32 << 20  # octets of large fragments' buffers kept for reuse
_MARK = struct.Struct(">I")

Record = bytes | bytearray


class RecordTooLarge(ConnectionError):
    """A record exceeds the size limit, or has too many fragments."""


def check_mark(
    mark: int, cost: int, fragments: int, max_record: int, max_fragments: int
) -> tuple[int, int]:
    """A fragment's ``mark`` judged before its bytes arrive, with the record so far (``cost``:
    its payload plus a mark for every fragment but the first; ``fragments`` finished): its
    length and the record's cost with it; RecordTooLarge if the record would exceed
    ``max_record`` or ``max_fragments``."""
    n = mark & MAX_FRAGMENT
    cost += n + (MARK_SIZE if fragments else 0)
    if cost > max_record:
        raise RecordTooLarge(
            f"record of at least {cost} bytes (marks included) exceeds {max_record}"
        )
    if not mark & LAST_FRAGMENT and fragments + 1 >= max_fragments:
        raise RecordTooLarge(f"record of more than {max_fragments} fragments")
    return n, cost


class LargeBuffers:
    """Buffers of large fragments handed on as records, for reuse once nothing else refers to
    them. Used from one thread (an event loop's), possibly by several receivers."""

    def __init__(self, keep_bytes: int = LARGE_BUFFERS_KEPT) -> None:
        self.keep_bytes = keep_bytes
        self._bufs: list[bytearray] = []  # handed on, oldest first
        self._bytes = 0
        self.reused = 0  # buffers taken again rather than made

    def take(self, n: int) -> bytearray:
        """A buffer of ``n`` octets: one handed on before that nothing else refers to any more
        (the oldest such), else a new one. Its contents are to be overwritten."""
        bufs = self._bufs
        for i in range(len(bufs)):
            buf = bufs[i]
            # (references: the list's, ``buf`` and getrefcount's argument; a record, reader
            # or view of it still held elsewhere adds one)
            if len(buf) == n and sys.getrefcount(buf) <= _FREE_REFS:
                del bufs[i]
                self._bytes -= n
                self.reused += 1
                return buf
        return bytearray(n)

    def keep(self, buf: bytearray) -> None:
        """``buf`` is being handed on (or was copied out of): remember it, within the limit
        (the oldest are let go: whoever still uses one keeps it alive)."""
        bufs = self._bufs
        bufs.append(buf)
        self._bytes += len(buf)
        while self._bytes > self.keep_bytes:
            self._bytes -= len(bufs.pop(0))


class RecordReceiver:
    """Sans-IO record-marking decoder that owns the buffers bytes are received into."""

    def __init__(
        self,
        max_record: int,
        max_fragments: int,
        *,
        buffer_size: int = RECEIVE_BUFFER,
        direct_threshold: int = DIRECT_THRESHOLD,
        large: LargeBuffers | None = None,
    ) -> None:
        if max_fragments < 1:
            raise ValueError("a record needs at least one fragment")
        if not 0 <= direct_threshold <= buffer_size - MARK_SIZE:
            raise ValueError("fragments up to the threshold must fit the buffer with their mark")
        self.max_record = max_record
        self.max_fragments = max_fragments
        self.direct_threshold = direct_threshold
        self._buf = bytearray(buffer_size)
        self._view = memoryview(self._buf)
        self._start = 0  # unconsumed bytes of _buf: [_start, _end)
        self._end = 0
        # A large fragment being received into a buffer of its own.
        self._direct: bytearray | None = None
        self._direct_view = self._view
        self._filled = 0
        self._direct_last = False
        self._direct_cost = 0
        self._record = bytearray()  # the finished fragments of the record in progress
        self._cost = 0  # the record so far: payload, plus a mark for every fragment but the first
        self._fragments = 0  # finished fragments of the record in progress
        self.large = large if large is not None else LargeBuffers()

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete record (the mark of a direct receive counted)."""
        direct = self._filled + MARK_SIZE if self._direct is not None else 0
        return self._end - self._start + direct + len(self._record)

    @property
    def in_record(self) -> bool:
        """Part of a record has arrived (at least one byte of it)."""
        return self._end > self._start or self._direct is not None or self._fragments > 0

    @property
    def receiving_direct(self) -> bool:
        """A large fragment is being received into a buffer of its own."""
        return self._direct is not None

    def reset(self) -> None:
        """Drop whatever is held (the connection is gone)."""
        self._start = self._end = 0
        self._direct = None
        self._direct_view = self._view
        self._filled = 0
        self._record = bytearray()
        self._cost = 0
        self._fragments = 0

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go (never empty; ``sizehint`` is ignored)."""
        if self._direct is not None:
            return self._direct_view[self._filled :]
        end = self._end
        return self._view[end:] if end else self._view

    def last_received(self, n: int) -> bytes:
        """A copy of the ``n`` bytes just written to the last ``get_buffer`` (before
        ``received``: for a capture hook)."""
        if self._direct is not None:
            return bytes(self._direct_view[self._filled : self._filled + n])
        return bytes(self._view[self._end : self._end + n])

    def received(self, n: int) -> list[Record]:
        """``n`` bytes were written at the start of the last ``get_buffer``; return the records
        they complete. Raises RecordTooLarge."""
        if self._direct is not None:
            self._filled += n
            if self._filled < len(self._direct):
                return []
            return self._direct_done()
        start = self._start
        end = self._end = self._end + n
        if not self._fragments and end - start > MARK_SIZE:
            # The usual receive: exactly one whole one-fragment record.
            (mark,) = _MARK.unpack_from(self._buf, start)
            if (
                mark & LAST_FRAGMENT
                and start + MARK_SIZE + (mark & MAX_FRAGMENT) == end
                and end - start - MARK_SIZE <= self.max_record
            ):
                self._start = self._end = 0
                return [bytes(self._view[start + MARK_SIZE : end])]
        return self._parse()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Record]:
        """Take bytes received elsewhere (copied into the receive buffers); the records they
        complete. A whole one-fragment record alone in ``data`` (bytes) is sliced out of it."""
        if (
            isinstance(data, bytes)
            and len(data) >= MARK_SIZE
            and self._end == self._start
            and self._direct is None
            and not self._fragments
        ):
            (mark,) = _MARK.unpack_from(data)
            n = mark & MAX_FRAGMENT
            if mark & LAST_FRAGMENT and n == len(data) - MARK_SIZE and n <= self.max_record:
                return [data[MARK_SIZE:]]
        src = memoryview(data).cast("B")
        records: list[Record] = []
        pos = 0
        while pos < len(src):
            dst = self.get_buffer()
            k = min(len(dst), len(src) - pos)
            dst[:k] = src[pos : pos + k]
            pos += k
            records += self.received(k)
        return records

    def _direct_done(self) -> list[Record]:
        frag = self._direct
        assert frag is not None
        self._direct = None
        self._direct_view = self._view
        self._filled = 0
        self.large.keep(frag)
        if not self._direct_last:
            self._record += frag
            self._cost = self._direct_cost
            self._fragments += 1
            return []
        if not self._fragments:
            return [frag]  # the record is the buffer it was received into
        self._record += frag
        return [self._finish()]

    def _finish(self) -> bytearray:
        rec = self._record
        self._record = bytearray()
        self._cost = 0
        self._fragments = 0
        return rec

    def _parse(self) -> list[Record]:
        buf, view = self._buf, self._view
        records: list[Record] = []
        pos, end = self._start, self._end
        while end - pos >= MARK_SIZE:
            (mark,) = _MARK.unpack_from(buf, pos)
            n, cost = check_mark(
                mark, self._cost, self._fragments, self.max_record, self.max_fragments
            )
            start = pos + MARK_SIZE
            have = end - start
            if have < n:
                if n > self.direct_threshold and end == len(buf):
                    # The shared buffer is full of the fragment (so its mark cannot make us
                    # hold more than the peer sent, times the buffer's share of the record
                    # limit): receive the rest straight into a buffer of the fragment's size.
                    frag = self.large.take(n)
                    frag[:have] = view[start:end]
                    self._direct = frag
                    self._direct_view = memoryview(frag)
                    self._filled = have
                    self._direct_last = bool(mark & LAST_FRAGMENT)
                    self._direct_cost = cost
                    self._start = self._end = 0
                    return records
                break
            pos = start + n
            if mark & LAST_FRAGMENT:
                if self._fragments:
                    self._record += view[start:pos]
                    records.append(self._finish())
                else:
                    records.append(bytes(view[start:pos]))  # its one copy
            else:
                self._record += view[start:pos]
                self._cost = cost
                self._fragments += 1
        if pos == end:
            self._start = self._end = 0
            return records
        # Keep the incomplete tail; move it to the front if what it still needs would not fit
        # (a fragment above the threshold needs only the rest of the buffer: then it goes on
        # in a buffer of its own).
        need = MARK_SIZE
        if end - pos >= MARK_SIZE:
            need += min(_MARK.unpack_from(buf, pos)[0] & MAX_FRAGMENT, self.direct_threshold)
        if pos + need > len(buf):
            view[: end - pos] = view[pos:end]
            end -= pos
            pos = 0
        self._start, self._end = pos, end
        return records


def _free_refs() -> int:
    """``sys.getrefcount`` of a kept buffer that nothing else holds, as ``LargeBuffers.take``
    sees it (measured the same way, so an interpreter that counts differently never reuses a
    buffer too early)."""
    bufs = [bytearray(1)]
    for i in range(len(bufs)):
        buf = bufs[i]
        return sys.getrefcount(buf)
    raise AssertionError("unreachable")


_FREE_REFS = _free_refs()
