"""``nfs://host[:port]/path`` (TCP, port 2049) and ``rdma://host[:port]/path`` (RPC-over-RDMA,
port 20049: UL-9). IPv6 hosts go in brackets: ``nfs://[::1]:2049/export``."""

from __future__ import annotations

import posixpath
import urllib.parse
from dataclasses import dataclass

DEFAULT_PORTS = {"nfs": 2049, "rdma": 20049}


@dataclass(frozen=True, slots=True)
class NfsUrl:
    scheme: str  # "nfs" or "rdma"
    host: str
    port: int
    path: str  # absolute, normalised; "/" for the server's root

    @property
    def transport(self) -> str:
        return "rdma" if self.scheme == "rdma" else "tcp"

    def with_path(self, path: str) -> NfsUrl:
        return NfsUrl(self.scheme, self.host, self.port, normalise(path))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def normalise(path: str) -> str:
    """Absolute, no ``.``/``..``/empty components, no trailing slash."""
    return posixpath.normpath("/" + path.lstrip("/"))


def parse_url(url: str) -> NfsUrl:
    """Raises ValueError for anything but nfs:// and rdma:// URLs with a host."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"{url!r}: the scheme must be nfs:// or rdma://")
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError as e:
        raise ValueError(f"{url!r}: bad port") from e
    path = urllib.parse.unquote(parts.path or "/")
    return NfsUrl(scheme, parts.hostname, port, normalise(path))


def is_url(text: str) -> bool:
    return text.lower().startswith(("nfs://", "rdma://"))
