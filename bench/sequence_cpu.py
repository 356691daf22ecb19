"""SEQUENCE's session-layer CPU (``ServerSessions.sequence_of`` then ``finish``), in process.

One session, made as the Linux client makes it (CREATE_SESSION4_FLAG_CONN_BACK_CHAN, AUTH_SYS
callback security, the connection bound for both channels) or, with ``--no-back-channel``, with
no back channel (no flags, the connection bound for the fore channel); every SEQUENCE a new
request on slot 0. Prints the best of ``--repeat`` measures of ``--count`` SEQUENCEs, in
microseconds of process CPU each, and the sr_status_flags reported (0 for both sessions).
Last line: ``sequence_us=… status_flags=… back_channel=0|1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.session.server import ServerSessions
from nfsrdma.xdr.gen import nfs4

PRINCIPAL = (True, 0, 0, ())
CB_SEC = nfs4.callback_sec_parms4(1, nfs4.authsys_parms(0, "bench-host", 0, 0, []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=100_000, help="SEQUENCEs per measure")
    ap.add_argument("--repeat", type=int, default=9, help="measures; the best is kept")
    ap.add_argument("--no-back-channel", action="store_true", help="a session without one")
    args = ap.parse_args()
    back = not args.no_back_channel
    s = ServerSessions(lease_time=90, slots=8, max_response_size_cached=4096)
    owner = nfs4.client_owner4(b"boot0001", b"bench")
    eia = nfs4.EXCHANGE_ID4args(owner, 0, nfs4.state_protect4_a(nfs4.SP4_NONE), [])
    eir = s.exchange_id(eia, principal=PRINCIPAL, now=0.0)
    fore = nfs4.channel_attrs4(0, 1049620, 1049480, 3428, 8, 64, [])
    csa = nfs4.CREATE_SESSION4args(
        eir.eir_clientid,
        eir.eir_sequenceid,
        nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN if back else 0,
        fore,
        nfs4.channel_attrs4(0, 4096, 4096, 0, 2, 1, []),
        0x40000000,
        [CB_SEC] if back else [],
    )
    conn = object()
    sessionid = s.create_session(csa, conn=conn, principal=PRINCIPAL, now=0.0).csr_sessionid
    seqid = 0
    flags = -1

    def one() -> None:
        nonlocal seqid, flags
        seqid += 1
        result = s.sequence_of(sessionid, seqid, 0, 0, False, conn, 1.0, 3, 200)
        flags = result.status_flags
        s.finish(result, None, 1.0)

    timer = timeit.Timer(one, timer=time.process_time)
    best = min(timer.repeat(number=args.count, repeat=args.repeat)) / args.count * 1e6
    print(f"sequence_us={best:.3f} status_flags={flags:#x} back_channel={int(back)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
