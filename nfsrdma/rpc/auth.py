"""RPC authentication flavours: AUTH_NONE and AUTH_SYS (RFC 5531 section 8.2 and Appendix A);
RPCSEC_GSS (RFC 2203) is checked in ``gss.py`` and yields the same ``Credential``.

The generated codec enforces the AUTH_SYS bounds (machine name of at most 255 bytes, at most
16 supplementary gids) and the 400-byte limit on any credential body."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from nfsrdma.xdr.gen import rpc
from nfsrdma.xdr.runtime import XdrError, pack, unpack

AUTH_NONE_CRED = rpc.opaque_auth(rpc.AUTH_NONE, b"")


class AuthError(Exception):
    """The call's credential is refused; the reply is MSG_DENIED / AUTH_ERROR with ``stat``."""

    def __init__(self, stat: rpc.auth_stat, message: str = "") -> None:
        super().__init__(message or stat.name)
        self.stat = stat


@dataclass(frozen=True, slots=True)
class Credential:
    """Who a call claims to be. AUTH_NONE calls have ``flavor`` AUTH_NONE and no identity."""

    flavor: int
    uid: int | None = None
    gid: int | None = None
    gids: tuple[int, ...] = ()
    machinename: str = ""
    principal: str = ""  # RPCSEC_GSS: the authenticated principal ("alice@REALM")
    gss_service: int = 0  # RPCSEC_GSS: rpc_gss_service_t (1 none, 2 integrity, 3 privacy)

    @property
    def is_anonymous(self) -> bool:
        return self.uid is None


ANONYMOUS = Credential(rpc.AUTH_NONE)

# RFC 2623 section 2.2 pseudo-flavours: Kerberos V5 with each RPCSEC_GSS service.
KRB5 = 390003
KRB5I = 390004
KRB5P = 390005
PSEUDOFLAVOR_NAMES = {rpc.AUTH_NONE: "none", rpc.AUTH_SYS: "sys", KRB5: "krb5", KRB5I: "krb5i"}
PSEUDOFLAVOR_NAMES[KRB5P] = "krb5p"
PSEUDOFLAVORS = {name: number for number, name in PSEUDOFLAVOR_NAMES.items()}


def pseudoflavor_of(cred: Credential) -> int:
    """The RFC 2623 pseudo-flavour a call used, as export rules (``sec=``), ``--sec`` and
    SECINFO name security: AUTH_NONE 0, AUTH_SYS 1, and for RPCSEC_GSS with Kerberos V5
    390003 / 390004 / 390005 (krb5 / krb5i / krb5p) by its service. Every admission by
    flavour goes through this."""
    if cred.flavor == rpc.RPCSEC_GSS:
        return KRB5 + max(cred.gss_service, 1) - 1
    return int(cred.flavor)


def auth_sys(
    uid: int | None = None,
    gid: int | None = None,
    gids: tuple[int, ...] | list[int] = (),
    machinename: str | None = None,
    stamp: int = 0,
) -> rpc.opaque_auth:
    """An AUTH_SYS credential (defaults: this process's identity and host name)."""
    parms = rpc.authsys_parms(
        stamp=stamp,
        machinename=socket.gethostname()[:255] if machinename is None else machinename,
        uid=os.getuid() if uid is None else uid,
        gid=os.getgid() if gid is None else gid,
        gids=list(gids),
    )
    return rpc.opaque_auth(rpc.AUTH_SYS, pack(rpc.enc_authsys_parms, parms))


# A client sends the same credential over and over: parsed ones are kept (a bounded cache).
_parsed: dict[bytes, Credential] = {}
_PARSED_MAX = 4096
# The AUTH_SYS credentials accepted so far, by their body (read only: ``credential_of`` fills
# it). The dispatcher's fast path takes a call's credential from here without decoding it.
KNOWN_SYS: Mapping[bytes, Credential] = _parsed


def credential_of(cred: rpc.opaque_auth, verf: rpc.opaque_auth) -> Credential:
    """Validate a call's credential and verifier; raise AuthError when they are refused."""
    if verf.flavor != rpc.AUTH_NONE:
        raise AuthError(rpc.AUTH_BADVERF, f"verifier flavour {verf.flavor} is not supported")
    if cred.flavor == rpc.AUTH_NONE:
        return ANONYMOUS
    if cred.flavor == rpc.AUTH_SYS:
        known = _parsed.get(cred.body)
        if known is not None:
            return known
        try:
            p = unpack(rpc.dec_authsys_parms, cred.body)
        except XdrError as e:
            raise AuthError(rpc.AUTH_BADCRED, f"malformed AUTH_SYS credential: {e}") from None
        parsed = Credential(rpc.AUTH_SYS, p.uid, p.gid, tuple(p.gids), p.machinename)
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[bytes(cred.body)] = parsed
        return parsed
    raise AuthError(rpc.AUTH_BADCRED, f"credential flavour {cred.flavor} is not supported")
