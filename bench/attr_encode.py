"""Micro-benchmark of the server's fattr4 encoding: ``python bench/attr_encode.py``.

Times ``encode_attrs`` on the bitmap the Linux client sends after most operations
(nfs4_fattr_bitmap: 15 attributes), alone and followed by the XDR encoding of the whole
GETATTR4res. Last line: ``ns_per_encode=… ns_per_getattr4res=… attr_vals_octets=…``
(lower is better). ``bench/xdr_codec.py`` uses its bitmap and sample attributes.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.nfs4.attrs import bitmap_of, encode_attrs
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.vfs.base import Attributes, FileType
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.nfs4_fattr import MASKS
from nfsrdma.xdr.runtime import Writer

# The attributes the Linux NFSv4.1 client asks for after OPEN, WRITE, SETATTR... (its
# nfs4_fattr_bitmap), as the codec generator knows them.
LINUX_GETATTR = [getattr(nfs4, f"FATTR4_{name.upper()}") for name in MASKS["linux_fattr"]]


def linux_getattr_bitmap() -> list[int]:
    return bitmap_of(LINUX_GETATTR)


SAMPLE = Attributes(
    type=FileType.NF4REG,
    mode=0o644,
    nlink=1,
    uid=1000,
    gid=1000,
    size=1 << 20,
    space_used=1 << 20,
    rdev=(0, 0),
    fsid=(8, 1),
    fileid=1234567,
    mounted_on_fileid=1234567,
    atime_ns=1_700_000_000_123_456_789,
    mtime_ns=1_700_000_000_123_456_789,
    ctime_ns=1_700_000_000_123_456_789,
    change=1_700_000_000_123_456_790,
)


def bench_encode_attrs(
    iterations: int = 100_000, bitmap: Sequence[int] | None = None
) -> dict[str, float]:
    """Nanoseconds per ``encode_attrs`` call, and per call plus GETATTR4res XDR encoding."""
    request = list(bitmap) if bitmap is not None else linux_getattr_bitmap()
    config = ServerConfig()
    fh = bytes(range(40))
    fattr = encode_attrs(request, SAMPLE, None, fh, config)  # compile the encoder
    t0 = time.perf_counter_ns()
    for _ in range(iterations):
        encode_attrs(request, SAMPLE, None, fh, config)
    t1 = time.perf_counter_ns()
    w = Writer()
    for _ in range(iterations):
        f = encode_attrs(request, SAMPLE, None, fh, config)
        nfs4.enc_GETATTR4res(w, nfs4.GETATTR4res(nfs4.NFS4_OK, nfs4.GETATTR4resok(f)))
        del w[:]
    t2 = time.perf_counter_ns()
    return {
        "ns_per_encode": (t1 - t0) / iterations,
        "ns_per_getattr4res": (t2 - t1) / iterations,
        "attr_vals_octets": float(len(fattr.attr_vals)),
    }


if __name__ == "__main__":
    figures = bench_encode_attrs()
    for key, value in figures.items():
        print(f"{key}: {value:.0f}")
    print(" ".join(f"{key}={value:.0f}" for key, value in figures.items()))
