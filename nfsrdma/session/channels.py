"""Channel attribute negotiation for CREATE_SESSION (RFC 8881 section 18.36.3; UL-33..UL-38).

Fore channel: every size and count is taken down to the server's ceiling, never raised.
Back channel: the client is the replier, so its sizes are what it can take; ca_maxoperations and
ca_maxrequests MUST NOT be changed (18.36.3; Linux checks it), ca_maxrequestsize may go down,
ca_maxresponsesize_cached goes to 0 (the server never sets csa_cachethis). Both channels:
ca_headerpadsize 0 (UL-35: RPC-over-RDMA v1 has no padded messages), ca_rdma_ird returned empty
(UL-34: the CM negotiates the real IRD; the XDR codec already refuses more than one element).

A client that offers sizes too small to carry anything gets NFS4ERR_TOOSMALL.
"""

from __future__ import annotations

from dataclasses import dataclass

from nfsrdma.session.errors import SessionError
from nfsrdma.xdr.gen import nfs4

# Smallest fore-channel request / reply worth having: an RPC header with an AUTH_SYS
# credential and a COMPOUND that holds SEQUENCE (and its reply).
FORE_MIN_REQUEST_SIZE = 256
FORE_MIN_RESPONSE_SIZE = 256
# What a CB_COMPOUND of CB_SEQUENCE + CB_RECALL (128-octet filehandle) needs, with the short
# AUTH_SYS credential the server sends callbacks with, and its reply.
BACK_MIN_REQUEST_SIZE = 512
BACK_MIN_RESPONSE_SIZE = 128
BACK_MIN_OPERATIONS = 2  # CB_SEQUENCE + one callback operation
# The smallest request-size ceiling a server may be configured with: a RENAME of two 255-octet
# names between two 128-octet filehandles, after SEQUENCE, with a 400-octet credential and
# verifier each (SS-18).
MIN_SERVER_REQUEST_SIZE = 2048


@dataclass(frozen=True, slots=True)
class ForeLimits:
    """The server's ceilings for the fore channel."""

    max_request_size: int
    max_response_size: int
    max_response_size_cached: int
    max_operations: int
    max_requests: int  # slots


def negotiate_fore(offer: nfs4.channel_attrs4, limits: ForeLimits) -> nfs4.channel_attrs4:
    if offer.ca_maxrequestsize < FORE_MIN_REQUEST_SIZE:
        raise SessionError(
            nfs4.NFS4ERR_TOOSMALL, f"fore ca_maxrequestsize {offer.ca_maxrequestsize}"
        )
    if offer.ca_maxresponsesize < FORE_MIN_RESPONSE_SIZE:
        raise SessionError(
            nfs4.NFS4ERR_TOOSMALL, f"fore ca_maxresponsesize {offer.ca_maxresponsesize}"
        )
    if offer.ca_maxoperations < 1:
        raise SessionError(nfs4.NFS4ERR_TOOSMALL, "fore ca_maxoperations 0")
    if offer.ca_maxrequests < 1:
        raise SessionError(nfs4.NFS4ERR_TOOSMALL, "fore ca_maxrequests 0")
    response = min(offer.ca_maxresponsesize, limits.max_response_size)
    return nfs4.channel_attrs4(
        ca_headerpadsize=0,
        ca_maxrequestsize=min(offer.ca_maxrequestsize, limits.max_request_size),
        ca_maxresponsesize=response,
        ca_maxresponsesize_cached=min(
            offer.ca_maxresponsesize_cached, limits.max_response_size_cached, response
        ),
        ca_maxoperations=min(offer.ca_maxoperations, limits.max_operations),
        ca_maxrequests=min(offer.ca_maxrequests, limits.max_requests),
        ca_rdma_ird=[],
    )


def negotiate_back(
    offer: nfs4.channel_attrs4, max_request_size: int, want_back_channel: bool
) -> nfs4.channel_attrs4:
    """The back channel's attributes. ``max_request_size`` caps the CB_COMPOUNDs we send."""
    if offer.ca_maxrequestsize < BACK_MIN_REQUEST_SIZE:
        raise SessionError(
            nfs4.NFS4ERR_TOOSMALL, f"back ca_maxrequestsize {offer.ca_maxrequestsize}"
        )
    if offer.ca_maxresponsesize < BACK_MIN_RESPONSE_SIZE:
        raise SessionError(
            nfs4.NFS4ERR_TOOSMALL, f"back ca_maxresponsesize {offer.ca_maxresponsesize}"
        )
    if offer.ca_maxoperations < BACK_MIN_OPERATIONS:
        raise SessionError(nfs4.NFS4ERR_TOOSMALL, f"back ca_maxoperations {offer.ca_maxoperations}")
    if want_back_channel and offer.ca_maxrequests < 1:
        raise SessionError(nfs4.NFS4ERR_TOOSMALL, "back channel requested with no slots")
    return nfs4.channel_attrs4(
        ca_headerpadsize=0,
        ca_maxrequestsize=min(offer.ca_maxrequestsize, max_request_size),
        ca_maxresponsesize=offer.ca_maxresponsesize,
        ca_maxresponsesize_cached=0,
        ca_maxoperations=offer.ca_maxoperations,
        ca_maxrequests=offer.ca_maxrequests,
        ca_rdma_ird=[],
    )
