"""Admission of transport connections: a limit on all of them, and a share per source address.

One address (loopback included: it is a source like any other) may hold at most
``max_per_source`` connections, so it cannot take every one of the server's ``max_total``.
A connection over either limit is refused: the server closes it as soon as it is accepted.
Sans-IO: the caller says which source a connection comes from and when it has gone.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


def source_of(peer: str) -> str:
    """The host part of a peer's address: "192.0.2.1:700" -> "192.0.2.1", "[::1]:700" and
    "::1:700" -> "::1"; a peer name that is not an address is its own source."""
    if peer.startswith("["):
        host, sep, _ = peer[1:].partition("]")
        if sep:
            return host
    if _is_address(peer):
        return peer
    host, sep, port = peer.rpartition(":")
    if sep and port.isdigit() and _is_address(host):
        return host
    return peer


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class ConnectionAdmission:
    max_total: int
    max_per_source: int
    total: int = 0
    by_source: dict[str, int] = field(default_factory=dict)
    refused: int = 0  # connections refused so far

    def __post_init__(self) -> None:
        if self.max_total < 1 or self.max_per_source < 1:
            raise ValueError("connection limits must be at least 1")

    def refusal(self, source: str) -> str | None:
        """Why a new connection from ``source`` would be refused now (None: it would not be).
        Counts nothing: a transport that can refuse before accepting (RDMA-CM reject) asks
        this first, then ``admit``s the connection it accepts."""
        held = self.by_source.get(source, 0)
        if self.total >= self.max_total:
            return f"{self.total} connections open, the limit is {self.max_total}"
        if held >= self.max_per_source:
            return (
                f"{held} connections from {source}, the share per source is {self.max_per_source}"
            )
        return None

    def admit(self, source: str) -> str | None:
        """Count a new connection from ``source``; or, over a limit, say why it is refused."""
        why = self.refusal(source)
        if why is not None:
            self.refused += 1
            return why
        self.total += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        return None

    def release(self, source: str) -> None:
        """An admitted connection from ``source`` has closed."""
        held = self.by_source.get(source, 0)
        if held <= 0:
            return
        self.total -= 1
        if held == 1:
            del self.by_source[source]
        else:
            self.by_source[source] = held - 1
