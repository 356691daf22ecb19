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
from enum import IntEnum
from typing import Any, Generic, TypeVar

from nfsrdma.xdr.writer import PAD, U32, Buffer, DdpItem, Writer, XdrError

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

__all__ = [
    "BOOL",
    "FALSE",
    "I32",
    "I64",
    "PAD",
    "TRUE",
    "U32",
    "U32_ARRAYS",
    "U64",
    "Buffer",
    "DdpItem",
    "Operation",
    "Reader",
    "Writer",
    "XdrError",
    "pack",
    "unpack",
    "unpack_from",
    "void_decode",
    "void_encode",
]

I32 = struct.Struct(">i")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
TRUE = U32.pack(1)
FALSE = U32.pack(0)
BOOL = (False, True)
# The Structs of arrays of 0 to 8 unsigned ints (bitmaps), by count; longer arrays make theirs.
U32_ARRAYS = tuple(struct.Struct(f">{n}I") for n in range(9))


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
        # (The class check first: bytes is what nearly every caller gives.)
        self.buf: bytes | memoryview = (
            data
            if data.__class__ is bytes or isinstance(data, bytes | memoryview)
            else memoryview(data)
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


class Operation(Generic[A, R]):
    """One operation of a COMPOUND-style procedure, as the generator writes it out from the
    argument and result unions: its number and name, and the codecs of its arguments ``A``
    (``None`` for an operation without) and of its result ``R``. Compared by identity."""

    __slots__ = (
        "dec_args",
        "dec_res",
        "enc_args",
        "enc_res",
        "error",
        "has_args",
        "head",
        "name",
        "number",
        "status_of",
    )

    def __init__(
        self,
        number: IntEnum,  # the enum member (kept as it is: a compiled int field would not be)
        name: str,  # the enum member's name ("OP_READ")
        has_args: bool,
        dec_args: Callable[[Reader, int], tuple[A, int]],
        enc_args: Callable[[Writer, A], None],
        dec_res: Callable[[Reader, int], tuple[R, int]],
        enc_res: Callable[[Writer, R], None],
        status_of: Callable[[R], int],  # the result's nfsstat4 (first field or discriminant)
        error: Callable[[int], R],  # the result for an error status without data
    ) -> None:
        self.number = number
        self.name = name
        self.has_args = has_args
        self.dec_args = dec_args
        self.enc_args = enc_args
        self.dec_res = dec_res
        self.enc_res = enc_res
        self.status_of = status_of
        self.error = error
        self.head = I32.pack(number)  # the operation number as the union discriminant

    def __repr__(self) -> str:
        return f"Operation({self.number}, {self.name!r})"

    def encode_result(self, w: Writer, res: R) -> None:
        """The result as its ``nfs_resop4`` arm: discriminant, then the result."""
        w += self.head
        self.enc_res(w, res)
