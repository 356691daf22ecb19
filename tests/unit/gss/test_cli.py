"""`nfsrdma serve --sec/--keytab/--gss-host` and the client's `--sec`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nfsrdma.cli import build_parser
from nfsrdma.rpc.gss_setup import SecuritySetupError
from nfsrdma.server_cli import security_of, serve
from nfsrdma.vfs.exports import parse as parse_exports
from tests.kdc import SERVER_HOST, Kdc


def test_serve_refuses_kerberos_without_a_usable_key(
    kdc: Kdc, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = build_parser().parse_args(
        ["serve", str(tmp_path), "--sec", "krb5p,sys", "--keytab", str(kdc.user_keytab),
         "--gss-host", SERVER_HOST]
    )  # fmt: skip
    with caplog.at_level(logging.ERROR, "nfsrdma.server"):
        assert serve(args) == 2
    assert f"needs a key for nfs/{SERVER_HOST}" in caplog.text
    assert "--keytab" in caplog.text


def test_serve_security_options(kdc: Kdc, tmp_path: Path) -> None:
    parse = build_parser().parse_args
    assert security_of(parse(["serve", str(tmp_path)]), None) == {}  # sys: as before
    args = parse(
        ["serve", str(tmp_path), "--sec", "krb5p,krb5i,krb5,sys", "--keytab",
         str(kdc.server_keytab), "--gss-host", SERVER_HOST]
    )  # fmt: skip
    sec = security_of(args, None)
    assert sec["sec"] == ("krb5p", "krb5i", "krb5", "sys") and sec["gss"] is not None
    with pytest.raises(SystemExit):
        parse(["serve", str(tmp_path), "--sec", "krb5,lipkey"])
    # An exports file: Kerberos is set up when a rule's sec= names it, and --sec is refused
    # (each rule says its own flavours; no server-wide NFS4ERR_WRONGSEC list).
    keytab = ["--keytab", str(kdc.server_keytab), "--gss-host", SERVER_HOST]
    exports = parse(["serve", "--exports", "unused", *keytab])
    assert security_of(exports, parse_exports(f"{tmp_path} *(rw)\n")) == {}
    gss = security_of(exports, parse_exports(f"{tmp_path} *(rw,sec=krb5p:sys)\n"))
    assert set(gss) == {"gss"} and gss["gss"] is not None
    with pytest.raises(SecuritySetupError):
        both = parse(["serve", "--exports", "unused", "--sec", "krb5", *keytab])
        security_of(both, parse_exports(f"{tmp_path} *(rw,sec=krb5)\n"))


def test_client_sec_flag() -> None:
    args = build_parser().parse_args(["ls", "--sec", "krb5i", "nfs://h/"])
    assert args.sec == "krb5i"
    assert build_parser().parse_args(["ls", "nfs://h/"]).sec == "sys"
