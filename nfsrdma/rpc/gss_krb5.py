"""Kerberos V5 for RPCSEC_GSS on MIT's GSS-API library (Debian's python3-gssapi).

Acceptor credentials come from a keytab (``nfs/<host>``); initiator credentials from the
caller's credential cache, or from a keytab (a client's machine principal). Contexts are made
with explicit flags, mutual authentication and integrity (and confidentiality) only: the GSS
library's own replay and sequence detection would refuse MICs that RPCSEC_GSS's sequence window
(RFC 2203 section 5.3.3.1) accepts out of order."""

from __future__ import annotations

import importlib
from typing import Any

from nfsrdma.rpc.gss_mech import GSS_S_FAILURE, GssFailure, GssSecurityContext

# python-gssapi, used dynamically (its package does not re-export its names for type checkers).
gssapi: Any
try:
    gssapi = importlib.import_module("gssapi")
    HAVE_GSSAPI = True
except ImportError:  # pragma: no cover - python3-gssapi is in scripts/setup.sh
    gssapi = None
    HAVE_GSSAPI = False


class GssUnavailable(RuntimeError):
    """Kerberos cannot be used: no gssapi module, or no usable key."""


def _failure(e: Exception) -> GssFailure:
    if HAVE_GSSAPI and isinstance(e, gssapi.raw.GSSError):
        return GssFailure(int(e.maj_code), int(e.min_code), str(e).splitlines()[0])
    return GssFailure(GSS_S_FAILURE, 0, str(e))


def _require() -> None:
    if not HAVE_GSSAPI:
        raise GssUnavailable("Kerberos needs the gssapi module (Debian: python3-gssapi)")


def _flags() -> list[Any]:
    f = gssapi.RequirementFlag
    return [f.mutual_authentication, f.integrity, f.confidentiality]


class Krb5Context:
    """One gssapi.SecurityContext behind the GssSecurityContext interface."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    @property
    def complete(self) -> bool:
        return bool(self._ctx.complete)

    @property
    def peer_name(self) -> str:
        ctx = self._ctx
        name = ctx.initiator_name if ctx.usage == "accept" else ctx.target_name
        return str(name)

    @property
    def lifetime(self) -> int | None:
        try:
            t = self._ctx.lifetime
        except Exception:
            return None
        return None if t is None else int(t)

    def step(self, token: bytes | None) -> bytes | None:
        try:
            out = self._ctx.step(token)
        except Exception as e:
            raise _failure(e) from None
        return None if out is None else bytes(out)

    def get_mic(self, data: bytes) -> bytes:
        try:
            return bytes(self._ctx.get_signature(data))
        except Exception as e:
            raise _failure(e) from None

    def verify_mic(self, data: bytes, mic: bytes) -> None:
        try:
            self._ctx.verify_signature(data, mic)
        except Exception as e:
            raise _failure(e) from None

    def wrap(self, data: bytes) -> bytes:
        try:
            res = self._ctx.wrap(data, True)
        except Exception as e:
            raise _failure(e) from None
        if not res.encrypted:
            raise GssFailure(GSS_S_FAILURE, 0, "the mechanism did not encrypt")
        return bytes(res.message)

    def unwrap(self, token: bytes) -> bytes:
        try:
            res = self._ctx.unwrap(token)
        except Exception as e:
            raise _failure(e) from None
        if not res.encrypted:
            raise GssFailure(GSS_S_FAILURE, 0, "privacy body was not encrypted")
        return bytes(res.message)


class Krb5Acceptor:
    """The server's Kerberos credentials: ``nfs/<host>`` (or any service key) from a keytab."""

    def __init__(self, keytab: str, host: str | None = None, service: str = "nfs") -> None:
        _require()
        self.keytab = keytab
        name = None
        if host is not None:
            name = gssapi.Name(f"{service}@{host}", gssapi.NameType.hostbased_service)
        try:
            self._creds = gssapi.Credentials(
                name=name, usage="accept", store={"keytab": f"FILE:{keytab}"}
            )
            # Acquiring acceptor credentials is lazy in MIT krb5: look at the keytab now, so
            # a server with no usable key says so at start and not at the first client.
            principals = _keytab_principals(keytab)
        except Exception as e:
            raise GssUnavailable(f"keytab {keytab}: {e}".splitlines()[0]) from None
        wanted = f"{service}/{host}@" if host is not None else f"{service}/"
        usable = [p for p in principals if p.startswith(wanted)]
        if not usable:
            raise GssUnavailable(
                f"keytab {keytab} has no key for {wanted.rstrip('@')}"
                + (f" (it holds: {', '.join(sorted(set(principals)))})" if principals else "")
            )
        self.service_principal = usable[0]

    def new_context(self) -> GssSecurityContext:
        return Krb5Context(gssapi.SecurityContext(creds=self._creds, usage="accept"))


def _keytab_principals(keytab: str) -> list[str]:
    """The principals a keytab holds keys for (MIT's keytab iteration, through the raw
    krb5 extension when present, else by reading the file format)."""
    from nfsrdma.rpc.keytab import principals

    return principals(keytab)


class Krb5Initiator:
    """A client's credentials for ``<service>@<host>``: from the credential cache (default, or
    ``ccache``), or from ``keytab`` for ``principal`` (a machine's ``host/...`` key)."""

    def __init__(
        self,
        host: str,
        service: str = "nfs",
        *,
        principal: str | None = None,
        ccache: str | None = None,
        keytab: str | None = None,
    ) -> None:
        _require()
        self.target = gssapi.Name(f"{service}@{host}", gssapi.NameType.hostbased_service)
        store: dict[str, str] = {}
        if ccache is not None:
            store["ccache"] = ccache
        if keytab is not None:
            store["client_keytab"] = keytab
            store.setdefault("ccache", f"MEMORY:nfsrdma-{id(self)}")
        name = None
        if principal is not None:
            name = gssapi.Name(principal, gssapi.NameType.kerberos_principal)
        try:
            self._creds = gssapi.Credentials(name=name, usage="initiate", store=store or None)
            self.principal = str(self._creds.name)
        except Exception as e:
            raise GssUnavailable(f"no Kerberos credentials: {e}".splitlines()[0]) from None

    def new_context(self) -> GssSecurityContext:
        ctx = gssapi.SecurityContext(
            name=self.target,
            creds=self._creds,
            usage="initiate",
            mech=gssapi.MechType.kerberos,
            flags=_flags(),
        )
        return Krb5Context(ctx)
