"""RDMA-CM Private Data for RPC-over-RDMA version 1 (RFC 8797): codec and negotiation.

Eight octets, big-endian, always placed at offset 0 of what we send (PD-12)::

    f6 ab 0e 18 | version (1) | 7 reserved bits + R (mask 0x01) | send size | receive size

A size code is (bytes / 1024) - 1, so 1024..262144 octets are representable (PD-5). Received
private data is searched at every offset for the identifier (PD-10); the first block with a known
version that lies wholly inside the buffer wins. Without one, the peer is taken to have sent
1024/1024 and R=0 (PD-9).

The Format Identifier 0xf6ab0e18 is the first entry of the IANA "RDMA-CM Private Data
Identifiers" subregistry (in the "Remote Direct Data Placement" group, Specification Required,
RFC 8797 §8.1); it is defined here and nowhere else (PD-22). Any identifier we might invent for
experiments would be unregistered, so project data rides after octet 8 of a plain v1 block
instead (PD-20).
"""

from __future__ import annotations

import enum
import logging
import struct
from dataclasses import dataclass

log = logging.getLogger(__name__)

FORMAT_IDENTIFIER = 0xF6AB0E18
VERSION = 1
BLOCK_LENGTH = 8
R_FLAG = 0x01  # octet 5, bit 0: the sender supports remote invalidation
MIN_INLINE_SIZE = 1024  # also the RFC 8166 §3.3.3 default inline threshold
MAX_INLINE_SIZE = 262144
DEFAULT_INLINE_SIZE = MIN_INLINE_SIZE

_IDENTIFIER = FORMAT_IDENTIFIER.to_bytes(4, "big")
_BLOCK = struct.Struct(">IBBBB")


class PrivateDataError(ValueError):
    """A block cannot be built: bad size configuration or no room on the fabric."""


class Fabric(enum.Enum):
    """Where the private data travels, for its size limits (PD-11)."""

    INFINIBAND = "ib"
    ROCE = "roce"
    IWARP = "iwarp"


# rdma_cm private data room: IB CM REQ/REP (RoCE uses the IB CM), MPA v2 for iWARP.
_LIMITS: dict[Fabric, tuple[int, int]] = {
    Fabric.INFINIBAND: (56, 196),
    Fabric.ROCE: (56, 196),
    Fabric.IWARP: (512, 512),
}


def private_data_limit(fabric: Fabric, *, accept: bool) -> int:
    """Octets of private data the fabric carries in a connect request or in an accept."""
    connect_limit, accept_limit = _LIMITS[fabric]
    return accept_limit if accept else connect_limit


def encode_size(nbytes: int) -> int:
    """Size code for a buffer of ``nbytes`` (PD-5): rounded down so the advertised size never
    exceeds the buffer, clamped to 0..255. Buffers below 1024 octets are refused."""
    if nbytes < MIN_INLINE_SIZE:
        raise PrivateDataError(f"inline buffers must be at least {MIN_INLINE_SIZE} octets")
    return min(nbytes // 1024 - 1, 255)


def decode_size(code: int) -> int:
    """Octets for a size code (PD-5)."""
    if not 0 <= code <= 255:
        raise PrivateDataError(f"size code {code} out of range")
    return (code + 1) * 1024


@dataclass(frozen=True, slots=True)
class PrivateData:
    """One peer's advertisement. Sizes are the octets meant (multiples of 1024 once decoded)."""

    send_size: int = DEFAULT_INLINE_SIZE
    receive_size: int = DEFAULT_INLINE_SIZE
    remote_invalidate: bool = False
    version: int = VERSION

    @classmethod
    def for_buffers(
        cls, send_buffer: int, receive_buffer: int, *, remote_invalidate: bool = False
    ) -> PrivateData:
        """What to advertise for the buffers actually provisioned (PD-6): each size is the
        largest representable value not above the buffer."""
        return cls(
            send_size=decode_size(encode_size(send_buffer)),
            receive_size=decode_size(encode_size(receive_buffer)),
            remote_invalidate=remote_invalidate,
        )


def encode(data: PrivateData, *, extension: bytes = b"", limit: int | None = None) -> bytes:
    """The version 1 block at offset 0, reserved bits zero (PD-2, PD-3, PD-12), then any
    project ``extension`` (PD-20). ``limit`` is the fabric's room (PD-11)."""
    flags = R_FLAG if data.remote_invalidate else 0
    block = _BLOCK.pack(
        FORMAT_IDENTIFIER,
        VERSION,
        flags,
        encode_size(data.send_size),
        encode_size(data.receive_size),
    )
    out = block + bytes(extension)
    if limit is not None and len(out) > limit:
        raise PrivateDataError(f"private data of {len(out)} octets exceeds the {limit} allowed")
    return out


def decode(buffer: bytes | bytearray | memoryview | None) -> PrivateData | None:
    """Find the block in received private data (PD-10, PD-13): ``None`` if there is none."""
    if not buffer:
        return None
    raw = bytes(buffer)
    start = 0
    while (at := raw.find(_IDENTIFIER, start)) >= 0:
        if at + BLOCK_LENGTH > len(raw):
            log.warning(
                "RPC-over-RDMA private data identifier at offset %d overruns the %d-octet buffer",
                at,
                len(raw),
            )
            return None
        _, version, flags, send_code, receive_code = _BLOCK.unpack_from(raw, at)
        if version != VERSION:
            log.warning(
                "RPC-over-RDMA private data version %d at offset %d not recognised; ignored",
                version,
                at,
            )
            start = at + 1
            continue
        return PrivateData(
            send_size=decode_size(send_code),
            receive_size=decode_size(receive_code),
            remote_invalidate=bool(flags & R_FLAG),
        )
    return None


@dataclass(frozen=True, slots=True)
class InlineThresholds:
    """Largest Send in each direction on one connection (PD-7, PD-8)."""

    client_to_server: int
    server_to_client: int


def inline_thresholds(client: PrivateData | None, server: PrivateData | None) -> InlineThresholds:
    """Thresholds from both advertisements; a missing one counts as 1024/1024 (PD-9). Each side
    calls this with its own block and the peer's decoded one, afresh on each connection
    (PD-14), so neither threshold exceeds that side's own advertised sizes (PD-21)."""
    c = client if client is not None else PrivateData()
    s = server if server is not None else PrivateData()
    return InlineThresholds(
        client_to_server=min(c.send_size, s.receive_size),
        server_to_client=min(s.send_size, c.receive_size),
    )


def check_receive_provisioning(advertised: PrivateData, smallest_receive_buffer: int) -> None:
    """Every posted receive must hold the advertised Receive Size (PD-6)."""
    if smallest_receive_buffer < advertised.receive_size:
        raise PrivateDataError(
            f"receive buffers of {smallest_receive_buffer} octets cannot hold the advertised "
            f"{advertised.receive_size}"
        )


# Remote invalidation (RFC 8797 §3.2, §4.1).


def responder_advertises_r(device_supports: bool, *, enabled: bool = True) -> bool:
    """A responder (server) sets R only if its device can Send with Invalidate (PD-16)."""
    return device_supports and enabled


def responder_may_send_with_invalidate(
    local_r: bool, peer: PrivateData | None, device_supports: bool
) -> bool:
    """Our server uses Send with Invalidate only when both peers set R and the device can
    (PD-15, PD-16; PD-18: unlike knfsd, our R=0 means no remote invalidation)."""
    return local_r and device_supports and peer is not None and peer.remote_invalidate


def requester_advertises_r(every_stag_is_window: bool, *, enabled: bool = True) -> bool:
    """A requester (client) sets R only if every STag it exposes on the connection may be
    invalidated remotely, i.e. is a per-RPC type-2 memory window (PD-17 a)."""
    return every_stag_is_window and enabled


def requester_expects_remote_invalidation(local_r: bool, peer: PrivateData | None) -> bool:
    """Having set R, our client must expect Send with Invalidate whatever the server
    advertised, because knfsd advertises R=0 yet invalidates (PD-17 b, PD-18)."""
    del peer  # deliberately ignored: the server's R bit does not matter here
    return local_r
