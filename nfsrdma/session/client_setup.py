"""Building the client's session: EXCHANGE_ID, CREATE_SESSION and BIND_CONN_TO_SESSION
arguments, and what their results mean (RFC 8881 sections 18.34-18.36), sans-IO."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from nfsrdma.xdr.gen import nfs4

IMPL_DOMAIN = b"nfsrdma.invalid"
IMPL_NAME = b"nfsrdma python client"
DEFAULT_CB_PROGRAM = 0x40000000 | 0x4E52  # in the range RFC 5531 leaves to users
PROBE_OVERHEAD = 4096  # room for the COMPOUND and RPC headers around READ/WRITE data


@dataclass(slots=True)
class SessionOptions:
    """What the client asks for; the server may grant less."""

    slots: int = 64
    back_slots: int = 4
    rsize: int = 1 << 20
    wsize: int = 1 << 20
    # Our largest cached reply (OPEN + GETFH + GETATTR) is a few hundred bytes; servers size
    # their slot tables by this (knfsd: 64 KiB of reply cache per session).
    max_response_size_cached: int = 1024
    max_operations: int = 32
    backchannel: bool = True
    cb_program: int = DEFAULT_CB_PROGRAM
    uid: int = 0
    gid: int = 0
    gids: tuple[int, ...] = ()
    machinename: str = field(default_factory=lambda: socket.gethostname()[:255])
    owner: bytes = b""  # client owner id; a unique one is made when empty
    probe_interval: float = 10.0  # ping when a call has waited this long without a reply
    probe_timeout: float = 10.0  # a ping (or lease renewal) not answered in this time: reconnect
    call_timeout: float = 120.0  # a call unanswered this long: reconnect and resend
    delay_deadline: float = 60.0  # give up retrying NFS4ERR_DELAY / GRACE after this long
    reconnect_deadline: float = 60.0  # give up reconnecting after this long
    # Minor versions to offer, in order: the first the server's EXCHANGE_ID accepts is used
    # (NFS4ERR_MINOR_VERS_MISMATCH moves on to the next), as the Linux client tries 4.2, 4.1.
    minor_versions: tuple[int, ...] = (2, 1)
    # Security: "sys", or Kerberos ("krb5", "krb5i", "krb5p") with the service principal
    # nfs@<gss_host> (default: the server's host name), credentials from the credential cache
    # (default, or ``ccache``) or from ``keytab`` for ``principal``; "auto" picks the first
    # flavour the server's SECINFO_NO_NAME lists that this client can use.
    sec: str = "sys"
    gss_host: str = ""
    ccache: str | None = None
    keytab: str | None = None
    principal: str | None = None

    def __post_init__(self) -> None:
        if not self.owner:
            self.owner = (
                f"nfsrdma/{self.machinename}/{os.getpid()}/{time.time_ns()}/".encode()
                + os.urandom(8).hex().encode()
            )


# SP4_MACH_CRED (RFC 8881 section 18.35.3): with RPCSEC_GSS, only our principal may create,
# rebind or destroy our sessions and client record.
MACH_CRED_ENFORCE = (
    nfs4.OP_CREATE_SESSION,
    nfs4.OP_DESTROY_SESSION,
    nfs4.OP_DESTROY_CLIENTID,
    nfs4.OP_BIND_CONN_TO_SESSION,
)


def _bitmap(ops: tuple[int, ...]) -> list[int]:
    words = [0] * (max(ops) // 32 + 1)
    for op in ops:
        words[op // 32] |= 1 << (op % 32)
    return words


def exchange_id_args(
    owner: bytes, verifier: bytes, mach_cred: bool = False
) -> nfs4.EXCHANGE_ID4args:
    now = time.time()
    protect = nfs4.state_protect4_a(nfs4.SP4_NONE)
    if mach_cred:
        ops = nfs4.state_protect_ops4(_bitmap(MACH_CRED_ENFORCE), [])
        protect = nfs4.state_protect4_a(nfs4.SP4_MACH_CRED, ops)
    return nfs4.EXCHANGE_ID4args(
        eia_clientowner=nfs4.client_owner4(verifier, owner),
        eia_flags=0,
        eia_state_protect=protect,
        eia_client_impl_id=[
            nfs4.nfs_impl_id4(IMPL_DOMAIN, IMPL_NAME, nfs4.nfstime4(int(now), 0)),
        ],
    )


def fore_channel_attrs(opts: SessionOptions) -> nfs4.channel_attrs4:
    return nfs4.channel_attrs4(
        ca_headerpadsize=0,  # UL-35
        ca_maxrequestsize=opts.wsize + PROBE_OVERHEAD,
        ca_maxresponsesize=opts.rsize + PROBE_OVERHEAD,
        ca_maxresponsesize_cached=opts.max_response_size_cached,
        ca_maxoperations=opts.max_operations,
        ca_maxrequests=opts.slots,
        ca_rdma_ird=[],  # UL-34
    )


def back_channel_attrs(opts: SessionOptions) -> nfs4.channel_attrs4:
    # Callbacks are inline only: keep them within a 4 KiB inline threshold (UL-38).
    return nfs4.channel_attrs4(
        ca_headerpadsize=0,
        ca_maxrequestsize=4096,
        ca_maxresponsesize=4096,
        ca_maxresponsesize_cached=4096,
        ca_maxoperations=4,
        ca_maxrequests=opts.back_slots,
        ca_rdma_ird=[],
    )


def create_session_args(
    opts: SessionOptions, clientid: int, sequence: int
) -> nfs4.CREATE_SESSION4args:
    flags = nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN if opts.backchannel else 0
    sec = [
        nfs4.callback_sec_parms4(
            nfs4.AUTH_SYS,
            nfs4.authsys_parms(0, opts.machinename, opts.uid, opts.gid, list(opts.gids)),
        ),
        nfs4.callback_sec_parms4(nfs4.AUTH_NONE),
    ]
    return nfs4.CREATE_SESSION4args(
        csa_clientid=clientid,
        csa_sequence=sequence,
        csa_flags=flags,  # never CONN_RDMA (UL-36)
        csa_fore_chan_attrs=fore_channel_attrs(opts),
        csa_back_chan_attrs=back_channel_attrs(opts),
        csa_cb_program=opts.cb_program,
        csa_sec_parms=sec,
    )


@dataclass(slots=True)
class Negotiated:
    """The session as the server granted it."""

    sessionid: bytes
    fore: nfs4.channel_attrs4
    back: nfs4.channel_attrs4
    backchannel: bool
    slots: int
    rsize: int
    wsize: int
    max_operations: int


def negotiated(opts: SessionOptions, res: nfs4.CREATE_SESSION4resok) -> Negotiated:
    fore = res.csr_fore_chan_attrs
    slots = max(1, min(opts.slots, fore.ca_maxrequests))
    # UL-6: the smaller of what we sent and what came back bounds replies.
    max_resp = min(fore.ca_maxresponsesize, opts.rsize + PROBE_OVERHEAD)
    max_req = min(fore.ca_maxrequestsize, opts.wsize + PROBE_OVERHEAD)
    rsize = _io_size(min(opts.rsize, max_resp - 512))
    wsize = _io_size(min(opts.wsize, max_req - 512))
    return Negotiated(
        sessionid=res.csr_sessionid,
        fore=fore,
        back=res.csr_back_chan_attrs,
        backchannel=bool(res.csr_flags & nfs4.CREATE_SESSION4_FLAG_CONN_BACK_CHAN),
        slots=slots,
        rsize=rsize,
        wsize=wsize,
        max_operations=max(2, min(opts.max_operations, fore.ca_maxoperations or 2)),
    )


def _io_size(n: int) -> int:
    """Round an I/O size down to a multiple of 4 KiB (at least 4 KiB)."""
    return max(4096, n & ~4095)


def bind_conn_args(sessionid: bytes, backchannel: bool) -> nfs4.BIND_CONN_TO_SESSION4args:
    return nfs4.BIND_CONN_TO_SESSION4args(
        bctsa_sessid=sessionid,
        bctsa_dir=nfs4.CDFC4_BACK_OR_BOTH if backchannel else nfs4.CDFC4_FORE,
        bctsa_use_conn_in_rdma_mode=False,  # UL-39
    )
