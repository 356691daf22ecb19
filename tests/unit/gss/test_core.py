"""The sans-IO pieces: the sequence window, principal mapping, pseudo-flavours, and the
server's refusal to start Kerberos without a usable key."""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

import pytest

from nfsrdma.rpc.auth import ANONYMOUS, Credential, pseudoflavor_of
from nfsrdma.rpc.gss_context import SequenceWindow
from nfsrdma.rpc.gss_identity import IdentityMap
from nfsrdma.rpc.gss_setup import SecuritySetupError, parse_sec, security_setup
from nfsrdma.rpc.keytab import principals
from nfsrdma.xdr.gen import rpc
from tests.kdc import SERVER_HOST, Kdc


def test_sequence_window() -> None:
    w = SequenceWindow(4)
    assert w.accept(10)
    assert not w.accept(10)  # seen
    assert w.accept(8)  # below the highest, inside the window, new
    assert not w.accept(8)
    assert not w.accept(6)  # 10 - 6 = 4: below a window of 4
    assert w.fresh(7) and w.accept(7)
    assert w.accept(100)  # a jump forgets everything below the new window
    assert not w.accept(96) and w.accept(97) and not w.accept(97)
    assert not w.fresh(100)


def test_principals_map_to_local_identities() -> None:
    m = IdentityMap()
    root = pwd.getpwuid(0).pw_name
    uid, gid, _ = m.identity(f"{root}@ANY.REALM") or (None, None, ())
    assert (uid, gid) == (0, 0)
    assert m.identity("4242@R") == (4242, 4242, ())  # numeric fallback
    assert m.identity("no-such-user-here@R") is None  # anonymous
    assert m.identity(f"host/{SERVER_HOST}@R") is None  # machine credentials: anonymous
    assert m.identity(f"nfs/{SERVER_HOST}@R") is None
    assert IdentityMap(machine=(7, 8)).identity("host/h@R") == (7, 8, ())


def test_pseudoflavors() -> None:
    assert pseudoflavor_of(ANONYMOUS) == 0
    assert pseudoflavor_of(Credential(rpc.AUTH_SYS, 1, 1)) == 1
    for service, number in ((1, 390003), (2, 390004), (3, 390005)):
        assert pseudoflavor_of(Credential(rpc.RPCSEC_GSS, gss_service=service)) == number
    assert parse_sec("krb5p,krb5i,krb5,sys") == ("krb5p", "krb5i", "krb5", "sys")
    with pytest.raises(ValueError):
        parse_sec("krb5,spkm3")


def test_keytab_without_the_service_key_is_refused_at_start(kdc: Kdc, tmp_path: Path) -> None:
    assert set(principals(str(kdc.server_keytab))) == {f"nfs/{SERVER_HOST}@NFSRDMA.TEST"}
    # The user's keytab holds no nfs/<host> key.
    with pytest.raises(SecuritySetupError, match=re.escape(f"needs a key for nfs/{SERVER_HOST}")):
        security_setup(("krb5",), str(kdc.user_keytab), SERVER_HOST)
    # A host name the keytab has no key for.
    with pytest.raises(SecuritySetupError, match=re.escape("nfs/other.nfsrdma.test")):
        security_setup(("krb5",), str(kdc.server_keytab), "other.nfsrdma.test")
    missing = tmp_path / "none.keytab"
    with pytest.raises(SecuritySetupError, match=re.escape(str(missing))):
        security_setup(("krb5",), str(missing), SERVER_HOST)
    empty = tmp_path / "empty.keytab"
    empty.write_bytes(b"\x05\x02")
    with pytest.raises(SecuritySetupError, match="needs a key"):
        security_setup(("krb5i",), str(empty), SERVER_HOST)
    flavors, gss = security_setup(("krb5p", "sys"), str(kdc.server_keytab), SERVER_HOST)
    assert flavors == (390005, 1) and gss is not None
    assert security_setup(("sys",)) == (None, None)
    assert os.path.exists(kdc.server_keytab)
