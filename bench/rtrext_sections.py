"""RT-7: decoding a continued message from its sections vs joining them once first.

A continued message arrives as sections (the payload of each transmission, a view into the
received data). The XDR decoders work on one contiguous buffer, so the reassembler joins the
sections once. This measures that copy against decoding: a COMPOUND reply with a 10,000-octet
tag and 20 GETATTRs (about 11 KiB, 3 sections of a 4 KiB inline size), and a 32 KiB message
(8 sections). Last line: ``join_us=… decode_us=… join_share=…`` (join / (join + decode)).
"""

from __future__ import annotations

import os
import sys
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Reader, Writer

SECTION = 4096 - 32  # a 4 KiB Send less the XMTCONT header


def main() -> None:
    attrs = nfs4.fattr4(
        [1 << nfs4.FATTR4_TYPE | 1 << nfs4.FATTR4_SIZE, 1 << (nfs4.FATTR4_OWNER - 32)],
        bytes(16) + (16).to_bytes(4, "big") + b"o" * 16,
    )
    ops = [nfs4.nfs_resop4(nfs4.OP_PUTROOTFH, nfs4.PUTROOTFH4res(nfs4.NFS4_OK))]
    ok = nfs4.GETATTR4res(nfs4.NFS4_OK, nfs4.GETATTR4resok(attrs))
    ops += [nfs4.nfs_resop4(nfs4.OP_GETATTR, ok)] * 20
    w = Writer()
    nfs4.enc_COMPOUND4res(w, nfs4.COMPOUND4res(nfs4.NFS4_OK, b"t" * 10_000, ops))
    data = bytes(w)
    sections = [memoryview(data)[i : i + SECTION] for i in range(0, len(data), SECTION)]
    n = 3000
    join = timeit.timeit(lambda: b"".join(sections), number=n * 10) / (n * 10)
    decode = timeit.timeit(lambda: nfs4.dec_COMPOUND4res(Reader(data), 0), number=n) / n
    big = [memoryview(os.urandom(SECTION)) for _ in range(8)]
    join32 = timeit.timeit(lambda: b"".join(big), number=n * 10) / (n * 10)
    print(f"COMPOUND reply {len(data)} octets in {len(sections)} sections")
    print(f"  join {join * 1e6:.2f} us, decode {decode * 1e6:.1f} us")
    print(f"32 KiB in 8 sections: join {join32 * 1e6:.2f} us")
    print(
        f"join_us={join * 1e6:.2f} decode_us={decode * 1e6:.1f} "
        f"join_share={join / (join + decode):.4f} join32k_us={join32 * 1e6:.2f}"
    )


if __name__ == "__main__":
    main()
