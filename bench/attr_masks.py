"""fattr4 encoding (server) and decoding (client) per attribute mask, in CPU time.

Masks: the 15 attributes of the Linux client's nfs4_fattr_bitmap (a listed mask, with its own
generated codec), the same without mode (a mask of the attributes Linux combines, coded group
by group), change+size, and mode alone. Uses only ``encode_attrs`` and ``decode_values``, so the
same script measures any revision. Last line: ``<mask>_enc_ns=… <mask>_dec_ns=…`` (best of
``--repeat``; lower is better).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attr_encode import LINUX_GETATTR, SAMPLE

from nfsrdma.nfs4.attr_decode import decode_values
from nfsrdma.nfs4.attrs import bitmap_of, encode_attrs
from nfsrdma.nfs4.server_state import ServerConfig
from nfsrdma.xdr.gen import nfs4

MASKS = {
    "linux15": bitmap_of(LINUX_GETATTR),
    "linux_no_mode": bitmap_of([n for n in LINUX_GETATTR if n != nfs4.FATTR4_MODE]),
    "change_size": bitmap_of([nfs4.FATTR4_CHANGE, nfs4.FATTR4_SIZE]),
    "mode": bitmap_of([nfs4.FATTR4_MODE]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=30000)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    config, fh, n = ServerConfig(), bytes(40), args.count
    figures: dict[str, float] = {}
    for name, mask in MASKS.items():
        fattr = encode_attrs(mask, SAMPLE, None, fh, config)
        enc = dec = float("inf")
        for _ in range(args.repeat):
            t0 = time.process_time_ns()
            for _ in range(n):
                encode_attrs(mask, SAMPLE, None, fh, config)
            t1 = time.process_time_ns()
            for _ in range(n):
                decode_values(fattr)
            t2 = time.process_time_ns()
            enc, dec = min(enc, (t1 - t0) / n), min(dec, (t2 - t1) / n)
        figures[f"{name}_enc_ns"], figures[f"{name}_dec_ns"] = enc, dec
        print(f"{name:>14}: encode {enc:6.0f} ns  decode {dec:6.0f} ns", flush=True)
    print(" ".join(f"{k}={v:.0f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
