"""What a read delegation lets the client keep (RFC 8881 sections 10.2, 10.4).

While the client holds a read delegation no other client can change the file: the server
recalls the delegation first (and a local change on the server breaks its kernel lease, which
recalls it too). So a file opened read-only under a read delegation keeps its attributes and the
data read so far, and serves repeated ``stat``/``read`` without asking the server, until the
delegation is recalled or returned (then this cache is dropped). Sans-IO.

The data kept is the prefix of the file read so far (sequential readers, the common case), up
to ``limit`` octets; reads elsewhere go to the server."""

from __future__ import annotations

from typing import Final

from nfsrdma.client.attrs import FileStat

DEFAULT_LIMIT: Final = 16 << 20


class DelegatedCache:
    def __init__(self, size: int, limit: int = DEFAULT_LIMIT) -> None:
        self.size = size  # the file's size when the delegation came (OPEN's GETATTR)
        self.limit = limit
        self.stat: FileStat | None = None
        self.data = bytearray()  # the file's first len(data) octets
        self.complete = False  # data is the whole file
        self.hits = 0

    def read(self, offset: int, sink: memoryview) -> tuple[int, bool] | None:
        """Fill ``sink`` from offset ``offset`` when the cache covers it: (octets, eof);
        None when the server must be asked."""
        end = offset + len(sink)
        have = len(self.data)
        if end <= have:
            sink[:] = self.data[offset:end]
            self.hits += 1
            return len(sink), self.complete and end == have
        if self.complete and offset <= have:
            n = have - offset
            sink[:n] = self.data[offset:have]
            self.hits += 1
            return n, True
        return None

    def store(self, offset: int, data: memoryview, eof: bool) -> None:
        """Data the server returned for a READ at ``offset``."""
        if offset != len(self.data) or self.complete or offset + len(data) > self.limit:
            return
        self.data += data
        if eof:
            self.complete = True
            self.size = len(self.data)
