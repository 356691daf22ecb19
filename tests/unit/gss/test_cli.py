"""`nfsrdma serve --sec/--keytab/--gss-host` and the client's `--sec`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nfsrdma.cli import build_parser
from nfsrdma.server_cli import security_of, serve
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
    assert security_of(parse(["serve", str(tmp_path)])) == {}  # sys: as before
    args = parse(
        ["serve", str(tmp_path), "--sec", "krb5p,krb5i,krb5,sys", "--keytab",
         str(kdc.server_keytab), "--gss-host", SERVER_HOST]
    )  # fmt: skip
    sec = security_of(args)
    assert sec["sec"] == ("krb5p", "krb5i", "krb5", "sys") and sec["gss"] is not None
    with pytest.raises(SystemExit):
        parse(["serve", str(tmp_path), "--sec", "krb5,lipkey"])


def test_client_sec_flag() -> None:
    args = build_parser().parse_args(["ls", "--sec", "krb5i", "nfs://h/"])
    assert args.sec == "krb5i"
    assert build_parser().parse_args(["ls", "nfs://h/"]).sec == "sys"
