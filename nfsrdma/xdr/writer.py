"""The XDR output buffer (see ``runtime``): a ``bytearray`` that also records DDP-eligible items.

It lives apart from ``runtime`` (which re-exports it) because it subclasses a builtin type,
which a native class of the compiled build (mypyc, ``setup.py``) cannot: this module always
stays Python, and compiled modules use it as they use any Python class.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

Buffer = bytes | bytearray | memoryview

U32 = struct.Struct(">I")
# PAD[n & 3] is the zero padding that follows n bytes of opaque data.
PAD = (b"", b"\0\0\0", b"\0\0", b"\0")


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
        # bytearray.__new__ made it empty; appending is cheaper than bytearray.__init__.
        if initial:
            self += initial
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
        """The whole stream as bytes, DDP items spliced back in with their padding."""
        ddp = self.ddp
        if not ddp:
            return bytes(self)
        out: list[Buffer] = []
        start = 0
        for item in ddp:
            data = item.data
            out += (self[start : item.offset], data, PAD[len(data) & 3])
            start = item.offset
        out.append(self[start:])
        return b"".join(out)
