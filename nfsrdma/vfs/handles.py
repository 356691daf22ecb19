"""File handle layout and authentication.

A handle is (all integers big-endian)::

    0      1       9            13     14         14+n           14+n+16
    | ver  | fileid | kernel type | n   | kernel fh  |  MAC (16)  |

``fileid`` is the object's st_ino; ``kernel type``/``kernel fh`` are what name_to_handle_at(2)
returned (type -1 and n = 0 if the file system has no kernel handles); MAC is HMAC-SHA256 under a
key derived from the export secret, truncated to 128 bits. The layout is a pure function of the
object, so the same object always gets the same handle, and a handle from another export (another
secret) fails authentication. At most 128 octets (NFS4_FHSIZE): kernel handles up to 98 octets
fit; ext4 uses 8, tmpfs 12, btrfs and xfs 20 or less.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Final

from nfsrdma.vfs.base import NFS4_FHSIZE, BadHandle

VERSION: Final = 1
MAC_SIZE: Final = 16
_SHA256_BLOCK: Final = 64  # SHA-256's block size, B in RFC 2104
_sha256 = hashlib.sha256
NO_KERNEL_HANDLE: Final = -1
_HEAD = struct.Struct(">BQiB")
MIN_SIZE: Final = _HEAD.size + MAC_SIZE
MAX_KERNEL_HANDLE: Final = NFS4_FHSIZE - MIN_SIZE
MADE_MAX: Final = 4096  # handles remembered by HandleCodec.pack


@dataclass(frozen=True, slots=True)
class HandleInfo:
    fileid: int
    ktype: int
    khandle: bytes


class HandleCodec:
    """Packs and authenticates handles for one export."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.digest(secret, b"nfsrdma file handle v1", "sha256")
        # HMAC-SHA256 (RFC 2104) is H(K ^ opad || H(K ^ ipad || body)): the key's two padded
        # blocks made once, each MAC is then two hashes (no HMAC object, no key schedule).
        block = self._key.ljust(_SHA256_BLOCK, b"\0")
        self._inner = bytes(b ^ 0x36 for b in block)
        self._outer = bytes(b ^ 0x5C for b in block)
        # Handles made, by body: a handle is a pure function of its body, and LOOKUP/OPEN make
        # the same ones again and again (bounded: forgotten all at once when full).
        self._made: dict[bytes, bytes] = {}

    def _mac(self, body: bytes) -> bytes:
        inner = _sha256(self._inner + body).digest()
        return _sha256(self._outer + inner).digest()[:MAC_SIZE]  # = hmac.digest(key, body)

    def pack(self, fileid: int, ktype: int, khandle: bytes) -> bytes:
        if len(khandle) > MAX_KERNEL_HANDLE:
            raise OSError(errno.EOVERFLOW, f"kernel file handle of {len(khandle)} octets too large")
        body = _HEAD.pack(VERSION, fileid, ktype, len(khandle)) + khandle
        fh = self._made.get(body)
        if fh is None:
            if len(self._made) >= MADE_MAX:
                self._made.clear()
            fh = self._made[body] = body + self._mac(body)
        return fh

    def unpack(self, fh: bytes) -> HandleInfo:
        """Check and decode a handle; raises :class:`BadHandle` unless we made it."""
        if not isinstance(fh, bytes) or not MIN_SIZE <= len(fh) <= NFS4_FHSIZE:
            raise BadHandle("bad handle length")
        version, fileid, ktype, n = _HEAD.unpack_from(fh, 0)
        if version != VERSION or len(fh) != MIN_SIZE + n:
            raise BadHandle("bad handle format")
        body = fh[:-MAC_SIZE]
        if not hmac.compare_digest(self._mac(body), fh[-MAC_SIZE:]):
            raise BadHandle("handle authentication failed")
        return HandleInfo(fileid, ktype, fh[_HEAD.size : _HEAD.size + n])
