"""Choosing a security flavour from the server's list (``sec="auto"``).

SECINFO_NO_NAME on the root (RFC 8881 section 18.45) lists the flavours the server accepts
there, in its order of preference; the client takes the first it can use: Kerberos V5 with
each RPCSEC_GSS service (when this machine can make Kerberos contexts), AUTH_SYS."""

from __future__ import annotations

import logging

from nfsrdma.client.errors import nfs_error
from nfsrdma.rpc.gss_mech import KRB5_OID_DER
from nfsrdma.session.client import ClientSession
from nfsrdma.xdr.gen import nfs4

log = logging.getLogger(__name__)
_GSS_NAMES = {1: "krb5", 2: "krb5i", 3: "krb5p"}


def flavor_names(entries: list[nfs4.secinfo4]) -> list[str]:
    """The usable names of SECINFO entries, in order ("sys", "krb5", ...)."""
    out = []
    for e in entries:
        if e.flavor == nfs4.AUTH_SYS:
            out.append("sys")
        elif (
            e.flavor == nfs4.RPCSEC_GSS
            and isinstance(e.value, nfs4.rpcsec_gss_info)
            and bytes(e.value.oid) == KRB5_OID_DER
            and e.value.service in _GSS_NAMES
        ):
            out.append(_GSS_NAMES[e.value.service])
    return out


async def server_flavors(session: ClientSession) -> list[str]:
    res = await session.compound(
        [
            nfs4.nfs_argop4(nfs4.OP_PUTROOTFH, None),
            nfs4.nfs_argop4(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH),
        ]
    )
    if res.status != nfs4.NFS4_OK:
        raise nfs_error(res.status, "SECINFO_NO_NAME")
    value = res.resarray[-1].value
    assert isinstance(value, nfs4.SECINFO4res) and value.value is not None
    return flavor_names(list(value.value))


async def choose_security(session: ClientSession) -> str:
    """Switch ``session`` to the first flavour the server lists that works here."""
    names = await server_flavors(session)
    for name in names:
        if name == "sys":
            session.use_security("sys")
            return name
        try:
            session.use_security(name)
        except Exception as e:  # no gssapi, no credentials: try the next flavour
            log.info("cannot use %s: %s", name, e)
            continue
        return name
    raise nfs_error(nfs4.NFS4ERR_WRONGSEC, f"no usable flavour among {names}")
