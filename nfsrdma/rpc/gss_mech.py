"""The GSS-API calls RPCSEC_GSS needs, behind a small interface (RFC 2203 section 5).

The RPCSEC_GSS protocol code (``gss.py``, ``gss_context.py``) sees only these Protocols; the
Kerberos V5 implementation on MIT's library (python-gssapi) is ``gss_krb5.py``. A failure of
any call is a ``GssFailure`` carrying the GSS major and minor status codes, which RFC 2203
puts on the wire in context creation results (section 5.2.3.2)."""

from __future__ import annotations

from typing import Protocol

# GSS-API major status codes (RFC 2743 section 1.2.1.1; RFC 2203 Appendix A)
GSS_S_COMPLETE = 0
GSS_S_CONTINUE_NEEDED = 1
GSS_S_BAD_MECH = 1 << 16
GSS_S_DEFECTIVE_TOKEN = 9 << 16
GSS_S_DEFECTIVE_CREDENTIAL = 10 << 16
GSS_S_CONTEXT_EXPIRED = 12 << 16
GSS_S_FAILURE = 13 << 16
GSS_S_BAD_SIG = 6 << 16

# The Kerberos V5 mechanism (RFC 1964): 1.2.840.113554.1.2.2, DER-encoded as SECINFO carries it.
KRB5_OID = "1.2.840.113554.1.2.2"
KRB5_OID_DER = bytes.fromhex("2a864886f712010202")


class GssFailure(Exception):
    """A GSS-API call failed."""

    def __init__(self, major: int, minor: int = 0, message: str = "") -> None:
        super().__init__(message or f"GSS major {major:#x} minor {minor:#x}")
        self.major = major
        self.minor = minor


class GssSecurityContext(Protocol):
    """An established (or establishing) GSS security context, either role."""

    @property
    def complete(self) -> bool: ...

    @property
    def peer_name(self) -> str:
        """The other side's principal ("alice@REALM"); known once complete."""
        ...

    @property
    def lifetime(self) -> int | None:
        """Seconds the context remains valid (None: indefinitely)."""
        ...

    def step(self, token: bytes | None) -> bytes | None:
        """Feed the peer's token (None for an initiator's first step); the token to send back,
        if any. Raises GssFailure."""
        ...

    def get_mic(self, data: bytes) -> bytes: ...

    def verify_mic(self, data: bytes, mic: bytes) -> None:
        """Raises GssFailure when the checksum does not verify."""
        ...

    def wrap(self, data: bytes) -> bytes:
        """Integrity and confidentiality."""
        ...

    def unwrap(self, token: bytes) -> bytes:
        """Raises GssFailure when the token does not unwrap, or was not encrypted."""
        ...


class GssAcceptor(Protocol):
    """The server's credentials: a new acceptor context per RPCSEC_GSS_INIT."""

    @property
    def service_principal(self) -> str: ...

    def new_context(self) -> GssSecurityContext: ...


class GssInitiator(Protocol):
    """A client's credentials for one target service: a new initiator context on demand."""

    def new_context(self) -> GssSecurityContext: ...
