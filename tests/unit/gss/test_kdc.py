"""The KDC fixture is real: a user gets a ticket and a service ticket for nfs/<host>."""

from __future__ import annotations

from pathlib import Path

import gssapi

from tests.kdc import SERVER_HOST, Kdc


def test_kdc_issues_tickets(kdc: Kdc, tmp_path: Path) -> None:
    ccache = tmp_path / "cc"
    kdc.kinit(ccache)
    creds = gssapi.Credentials(
        name=gssapi.Name(kdc.user_principal, gssapi.NameType.kerberos_principal),
        usage="initiate",
        store={"ccache": f"FILE:{ccache}"},
    )
    target = gssapi.Name(f"nfs@{SERVER_HOST}", gssapi.NameType.hostbased_service)
    ctx = gssapi.SecurityContext(name=target, creds=creds, usage="initiate")
    token = ctx.step()
    acceptor = gssapi.SecurityContext(
        creds=gssapi.Credentials(usage="accept", store={"keytab": str(kdc.server_keytab)}),
        usage="accept",
    )
    reply = acceptor.step(token)
    if reply:
        ctx.step(reply)
    assert acceptor.complete
    assert str(acceptor.initiator_name) == kdc.user_principal
