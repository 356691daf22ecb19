"""What the generated XDR codecs need at run time, and the entry points to use them.

Encoding appends to a ``Writer`` (a ``bytearray`` that also records DDP-eligible items);
decoding reads a ``Reader`` (a ``memoryview`` plus the RDMA chunks that stand in for
DDP-eligible items). Every decoder failure is one exception type, ``XdrError``, carrying the
offset where the offending item starts.

DDP-eligible items (RFC 8267 section 6.1: WRITE data, READ data, READLINK data, symlink text)
are variable-length opaques that a transport may move out of the XDR stream. The encoder writes
their length word inline and records the data as a ``DdpItem`` instead of copying it into the
stream; ``Writer.pieces()`` splices them back in for byte-stream transports, while RPC-over-RDMA
turns them into chunks. The decoder, given chunks keyed by their position in the XDR stream,
takes such an item's data from its chunk (RFC 8166 section 3.4: the length stays inline, the data
and its round-up padding do not).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

Buffer = bytes | bytearray | memoryview

U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
TRUE = U32.pack(1)
FALSE = U32.pack(0)
# PAD[n & 3] is the zero padding that follows n bytes of opaque data.
PAD = (b"", b"\0\0\0", b"\0\0", b"\0")
BOOL = (False, True)


class XdrError(ValueError):
    """Malformed, truncated or oversized XDR (decoding), or an unencodable value (encoding)."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(f"{message} (at offset {offset})")
        self.offset = offset


@dataclass(slots=True)
class DdpItem:
    """A DDP-eligible opaque left out of the stream: its data belongs at ``offset``."""

    offset: int  # in the Writer's own bytes, just after the item's length word
    data: Buffer
    tag: int  # the Writer's ddp_tag when the item was encoded (the NFS layer's op ordinal)

    @property
    def padded_length(self) -> int:
        return len(self.data) + (-len(self.data) & 3)


class Writer(bytearray):
    """An XDR output buffer. ``ddp`` collects DDP-eligible items in stream order."""

    __slots__ = ("ddp", "ddp_tag")

    def __init__(self, initial: Buffer = b"") -> None:
        super().__init__(initial)
        self.ddp: list[DdpItem] = []
        self.ddp_tag = 0

    def put_ddp(self, data: Buffer, maxlen: int | None) -> None:
        n = len(data)
        if maxlen is not None and n > maxlen:
            raise XdrError(f"opaque of {n} bytes exceeds its bound {maxlen}", len(self))
        self += U32.pack(n)
        self.ddp.append(DdpItem(len(self), data, self.ddp_tag))

    def stream_position(self, item: DdpItem) -> int:
        """The item's offset in the full XDR stream (as if every DDP item were inline)."""
        pos = item.offset
        for other in self.ddp:
            if other is item:
                return pos
            pos += other.padded_length
        raise ValueError("item does not belong to this writer")

    def pieces(self, keep: Callable[[DdpItem], bool] | None = None) -> list[Buffer]:
        """The stream as buffers to send in order, DDP items spliced back in with padding.

        Items for which ``keep`` is true stay out (a transport moves them by other means)."""
        if not self.ddp:
            return [self]
        view = memoryview(self)
        out: list[Buffer] = []
        start = 0
        for item in self.ddp:
            if keep is not None and keep(item):
                continue
            out.append(view[start : item.offset])
            out.append(item.data)
            pad = PAD[len(item.data) & 3]
            if pad:
                out.append(pad)
            start = item.offset
        out.append(view[start:])
        return out

    def flatten(self) -> bytes:
        return b"".join(self.pieces())


class Reader:
    """XDR input: a buffer, and the chunks that carry DDP-eligible items.

    Calls name their chunks by position (RPC-over-RDMA Read chunks): ``chunks`` maps an item's
    position in the XDR stream (counted from the start of ``buf`` as if every chunk were
    inline) to its data, and ``shift`` is how many stream bytes have come from chunks so far,
    so that ``inline offset + shift`` is the stream position. Replies carry Write chunks, which
    pair with DDP-eligible items in order (RFC 8267 section 6.4.1): ``ordered[n]`` holds the
    data the responder wrote for the n-th item, or None where that item came inline.
    """

    __slots__ = ("buf", "chunks", "ordered", "shift")

    def __init__(
        self,
        data: Buffer,
        chunks: dict[int, Buffer] | None = None,
        ordered: list[Buffer | None] | None = None,
    ) -> None:
        # bytes stay bytes (slicing them is cheapest); anything else is viewed, not copied.
        self.buf: bytes | memoryview = (
            data if isinstance(data, bytes | memoryview) else memoryview(data)
        )
        self.chunks = chunks
        self.ordered = ordered
        self.shift = 0

    def take_ddp(self, off: int, maxlen: int | None) -> tuple[Buffer, int]:
        """Decode a DDP-eligible opaque at ``off``: from its chunk when one is there."""
        buf = self.buf
        if off + 4 > len(buf):
            raise XdrError("truncated opaque length", off)
        (n,) = U32.unpack_from(buf, off)
        if maxlen is not None and n > maxlen:
            raise XdrError(f"opaque of {n} bytes exceeds its bound {maxlen}", off)
        off += 4
        data: Buffer | None = None
        if self.ordered:
            data = self.ordered.pop(0)
            if data is not None and len(data) == 0 and n:
                data = None  # an unused Write chunk: the item came inline (RFC 8267 6.4.1)
        elif self.chunks:
            data = self.chunks.pop(off + self.shift, None)
        if data is not None:
            if len(data) < n:
                raise XdrError(f"chunk of {len(data)} bytes for an opaque of {n}", off)
            self.shift += n + (-n & 3)
            view = data if isinstance(data, memoryview) else memoryview(data)
            return view[:n], off
        end = off + n
        if end + (-n & 3) > len(buf):
            raise XdrError(f"opaque of {n} bytes runs past the end", off)
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        return view[off:end], end + (-n & 3)


def pack(encode: Callable[[Writer, T], None], value: T) -> bytes:
    """Encode ``value`` into bytes (DDP items spliced inline)."""
    w = Writer()
    encode(w, value)
    return w.flatten()


def unpack(
    decode: Callable[[Reader, int], tuple[T, int]],
    data: Buffer,
    *,
    offset: int = 0,
    exact: bool = True,
) -> T:
    """Decode one value from ``data``; with ``exact``, trailing bytes are an error."""
    r = Reader(data)
    value, end = decode(r, offset)
    if exact and end != len(r.buf):
        raise XdrError(f"{len(r.buf) - end} trailing bytes", end)
    return value


def unpack_from(
    decode: Callable[[Reader, int], tuple[T, int]], r: Reader, offset: int
) -> tuple[T, int]:
    """Decode one value from a Reader at ``offset``; returns it and the offset after it."""
    return decode(r, offset)


def void_encode(w: Writer, v: Any) -> None:
    return None


def void_decode(r: Reader, off: int) -> tuple[None, int]:
    return None, off


@dataclass(frozen=True, slots=True, eq=False)
class Operation(Generic[A, R]):
    """One operation of a COMPOUND-style procedure, as the generator writes it out from the
    argument and result unions: its number and name, and the codecs of its arguments ``A``
    (``None`` for an operation without) and of its result ``R``."""

    number: int
    name: str  # the enum member's name ("OP_READ")
    has_args: bool
    dec_args: Callable[[Reader, int], tuple[A, int]]
    enc_args: Callable[[Writer, A], None]
    dec_res: Callable[[Reader, int], tuple[R, int]]
    enc_res: Callable[[Writer, R], None]
    status_of: Callable[[R], int]  # the result's nfsstat4 (its first field or discriminant)
    error: Callable[[int], R]  # the result for an error status without data
    head: bytes = field(init=False)  # the operation number as the union discriminant

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", I32.pack(self.number))

    def encode_result(self, w: Writer, res: R) -> None:
        """The result as its ``nfs_resop4`` arm: discriminant, then the result."""
        w += self.head
        self.enc_res(w, res)
