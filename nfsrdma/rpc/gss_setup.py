"""The server's security flavours from its options: ``--sec`` names and the Kerberos keytab.

``security_setup`` turns ``("krb5p", "krb5i", "krb5", "sys")`` into RFC 2623 pseudo-flavours
(in the order given, which is SECINFO's) and, when a Kerberos flavour is among them, an RPCSEC_GSS
server whose acceptor credentials come from the keytab's ``nfs/<host>`` key. A keytab without
such a key is an error at start (``SecuritySetupError``), not at the first client."""

from __future__ import annotations

import socket

from nfsrdma.rpc.auth import KRB5, KRB5I, KRB5P, PSEUDOFLAVORS
from nfsrdma.rpc.gss import GssServer
from nfsrdma.rpc.gss_identity import IdentityMap

DEFAULT_KEYTAB = "/etc/krb5.keytab"
SEC_NAMES = ("sys", "krb5", "krb5i", "krb5p", "none")


class SecuritySetupError(ValueError):
    pass


def parse_sec(text: str) -> tuple[str, ...]:
    """ "krb5p,krb5i,sys" → ("krb5p", "krb5i", "sys"); ValueError for an unknown name."""
    names = tuple(n.strip().lower() for n in text.replace(":", ",").split(",") if n.strip())
    bad = [n for n in names if n not in SEC_NAMES]
    if bad or not names:
        raise ValueError(f"unknown security flavour {', '.join(bad) or text!r}: use {SEC_NAMES}")
    return names


def security_setup(
    sec: tuple[str, ...],
    keytab: str = DEFAULT_KEYTAB,
    gss_host: str | None = None,
    gss: GssServer | None = None,
    identities: IdentityMap | None = None,
) -> tuple[tuple[int, ...] | None, GssServer | None]:
    """(pseudo-flavours in order, or None for the plain sys default; the GSS server or None)."""
    flavors = tuple(PSEUDOFLAVORS[n] for n in sec)
    if flavors == (PSEUDOFLAVORS["sys"],) and gss is None:
        return None, None
    if gss is None and any(f in (KRB5, KRB5I, KRB5P) for f in flavors):
        from nfsrdma.rpc.gss_krb5 import GssUnavailable, Krb5Acceptor

        host = gss_host or socket.getfqdn()
        try:
            acceptor = Krb5Acceptor(keytab, host)
        except GssUnavailable as e:
            raise SecuritySetupError(
                f"cannot serve Kerberos (--sec {','.join(sec)}): {e}; the keytab (--keytab) "
                f"needs a key for nfs/{host}"
            ) from None
        gss = GssServer(acceptor, identities)
    return flavors, gss
