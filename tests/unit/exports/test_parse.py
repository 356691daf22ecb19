"""The exports(5) file format: valid and invalid files, client matching, `exports check`."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

import pytest

from nfsrdma.cli import main
from nfsrdma.vfs.base import Cred
from nfsrdma.vfs.exports import (
    AUTH_NONE,
    AUTH_SYS,
    RPCSEC_GSS_KRB5I,
    RPCSEC_GSS_KRB5P,
    ExportsError,
    Options,
    Squash,
    client_address,
    default_fsid,
    parse,
)

HOSTS = {"alpha": ["192.0.2.7"], "beta": ["2001:db8::5", "198.51.100.9"]}


def resolve(name: str) -> Sequence[str]:
    try:
        return HOSTS[name]
    except KeyError:
        raise OSError(f"unknown host {name}") from None


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_a_full_file() -> None:
    text = (
        "# exports for the lab\n"
        "\n"
        "/srv/data   192.0.2.0/24(rw,no_root_squash,insecure)  *(ro)   # trailing comment\n"
        '"/srv/with space"  alpha(rw,all_squash,anonuid=1000,anongid=100) \\\n'
        "      beta(sec=krb5p:krb5i:sys,fsid=42,sync,no_subtree_check)\n"
        "/srv/v6 2001:db8::/32(rw) ::1 10.0.0.0/255.0.0.0(ro,sec=none)\n"
        "/srv/o\\040ctal *(rw)\n"
    )
    table = parse(text, "exports", resolve)
    data, spaced, v6, octal = table.entries
    assert data.path == "/srv/data" and data.fsid == default_fsid("/srv/data")
    rw, world = data.rules
    assert rw.options == Options(read_only=False, squash=Squash.NONE, secure=False)
    assert rw.line == 3
    # exports(5) defaults: ro, root_squash, secure, sec=sys.
    assert world.options == Options()
    assert world.options.read_only and world.options.secure
    assert world.options.flavors == (AUTH_SYS,)

    assert spaced.path == "/srv/with space"
    assert spaced.fsid == 42
    a, b = spaced.rules
    assert a.options.squash is Squash.ALL and (a.options.anon_uid, a.options.anon_gid) == (
        1000,
        100,
    )
    assert b.options.flavors == (RPCSEC_GSS_KRB5P, RPCSEC_GSS_KRB5I, AUTH_SYS)
    assert b.line == 4  # a continued line is reported by its first line
    assert b.client.networks == (
        ipaddress.ip_network("2001:db8::5/128"),
        ipaddress.ip_network("198.51.100.9/32"),
    )

    assert [r.client.text for r in v6.rules] == ["2001:db8::/32", "::1", "10.0.0.0/255.0.0.0"]
    assert v6.rules[2].client.networks == (ipaddress.ip_network("10.0.0.0/8"),)
    assert v6.rules[2].options.flavors == (AUTH_NONE,)
    assert v6.rules[1].options == Options()  # a client without options gets the defaults
    assert octal.path == "/srv/o ctal"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/srv *(rw,fast)\n", "exports:1: unknown option 'fast'"),
        ("\n\n/srv *(rw,sec=krb6)\n", "exports:3: option 'sec=krb6': unknown security flavour"),
        ("/srv *(anonuid=x)\n", "exports:1: option 'anonuid=x': a number"),
        ("/srv *(fsid=0)\n", "exports:1: option 'fsid=0': the pseudo-root"),
        ("/srv *(fsid=root)\n", "exports:1: option 'fsid=root'"),
        ("srv *(rw)\n", "exports:1: export path 'srv' is not absolute"),
        ("/ *(rw)\n", "exports:1: '/' cannot be exported"),
        ("/srv\n", "exports:1: /srv: no client"),
        ("/srv (rw)\n", "exports:1: options '(rw)' without a client"),
        ("/srv *(rw\n", "exports:1: client '*(rw': options must end with ')'"),
        ("/srv @group(rw)\n", "netgroups are not supported"),
        ("/srv *.example.com(rw)\n", "wildcard host names are not supported"),
        ("/srv 10.0.0.0/33(rw)\n", "client '10.0.0.0/33': not a network"),
        ("/srv nosuchhost(rw)\n", "exports:1: client 'nosuchhost': host name does not resolve"),
        ("/srv *(rw)\n/srv/ 1.2.3.4\n", "exports:2: /srv is exported already (line 1)"),
        ("/srv *(rw)\n/srv/sub *(rw)\n", "exports:2: /srv/sub and /srv (line 1) are nested"),
        ("/a *(fsid=5)\n/b *(fsid=5)\n", "exports:2: fsid 5 of /b is the fsid of /a already"),
        ("/a 1.2.3.4(fsid=5) *(fsid=6)\n", "exports:1: /a: two different fsid= values"),
        ("/a \\\n  *(rw,nope)\n", "exports:1: unknown option 'nope'"),
    ],
)
def test_bad_lines_name_file_line_and_option(text: str, message: str) -> None:
    with pytest.raises(ExportsError) as e:
        parse(text, "exports", resolve)
    assert message in str(e.value)


def test_first_matching_rule_wins_in_written_order() -> None:
    (entry,) = parse(
        "/srv 192.0.2.7(rw) 192.0.2.0/24(ro,all_squash) *(ro,sec=none) ::1(rw)\n",
        "exports",
        resolve,
    ).entries
    rule = entry.rule_for(ip("192.0.2.7"))
    assert rule is not None and not rule.options.read_only
    rule = entry.rule_for(ip("192.0.2.8"))
    assert rule is not None and rule.options.squash is Squash.ALL
    rule = entry.rule_for(ip("203.0.113.1"))
    assert rule is not None and rule.options.flavors == (AUTH_NONE,)
    # '*' comes before ::1, so ::1 gets the '*' rule: written order, not specificity.
    rule = entry.rule_for(ip("::1"))
    assert rule is not None and rule.client.text == "*"


def test_addresses_networks_ipv6_and_host_names() -> None:
    (entry,) = parse(
        "/srv 127.0.0.2(rw) 10.1.0.0/16(ro) fd00::/8(rw) alpha(ro) beta(ro)\n",
        "exports",
        resolve,
    ).entries
    assert entry.rule_for(ip("127.0.0.2")) is entry.rules[0]
    assert entry.rule_for(ip("127.0.0.3")) is None
    assert entry.rule_for(ip("10.1.255.255")) is entry.rules[1]
    assert entry.rule_for(ip("10.2.0.1")) is None
    assert entry.rule_for(ip("fd12::1")) is entry.rules[2]
    assert entry.rule_for(ip("fe80::1")) is None
    assert entry.rule_for(ip("192.0.2.7")) is entry.rules[3]
    assert entry.rule_for(ip("198.51.100.9")) is entry.rules[4]
    assert entry.rule_for(ip("2001:db8::5")) is entry.rules[4]


def test_real_resolution_of_localhost() -> None:
    (entry,) = parse("/srv localhost(rw)\n").entries
    assert entry.rule_for(ip("127.0.0.1")) is not None
    assert entry.rule_for(ip("192.0.2.1")) is None


@pytest.mark.parametrize(
    ("peer", "address", "port"),
    [
        ("192.0.2.1:700", "192.0.2.1", 700),
        ("[::1]:2049", "::1", 2049),
        ("::1:2049", "::1", 2049),
        ("::1", "::1", 0),
        ("2001:db8::5", "2001:db8::5", 0),
        ("[::ffff:127.0.0.2]:9", "127.0.0.2", 9),
        ("127.0.0.3", "127.0.0.3", 0),
    ],
)
def test_client_address(peer: str, address: str, port: int) -> None:
    assert client_address(peer) == (ip(address), port)


def test_client_address_of_no_address() -> None:
    assert client_address("rdma-peer") == (None, 0)
    assert client_address("?") == (None, 0)


def test_squash_options() -> None:
    root = Cred(0, 0, (0, 5))
    user = Cred(1000, 100, (5,))
    o = Options()
    assert o.identity(root, AUTH_SYS) == Cred(65534, 65534, (65534, 5))
    assert o.identity(user, AUTH_SYS) == user
    assert o.identity(user, AUTH_NONE) == Cred(65534, 65534, ())
    o = Options(squash=Squash.NONE)
    assert o.identity(root, AUTH_SYS) == root
    o = Options(squash=Squash.ALL, anon_uid=7, anon_gid=8)
    assert o.identity(user, AUTH_SYS) == Cred(7, 8, ())


def test_exports_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    good = tmp_path / "good"
    good.write_text(f"{tmp_path / 'a'} 127.0.0.1(rw,insecure) *(ro,sec=krb5:sys)\n")
    assert main(["exports", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "127.0.0.1(rw,root_squash,insecure,sec=sys)" in out
    assert "*(ro,root_squash,secure,sec=krb5:sys)" in out
    assert "1 export(s), ok" in out

    bad = tmp_path / "bad"
    bad.write_text(f"# c\n{tmp_path / 'a'} *(rw,turbo)\n")
    assert main(["exports", "check", str(bad)]) == 1
    assert f"{bad}:2: unknown option 'turbo'" in capsys.readouterr().err

    missing = tmp_path / "missing"
    missing.write_text(f"{tmp_path / 'nothere'} *(rw)\n")
    assert main(["exports", "check", str(missing)]) == 1
    assert "is not a directory" in capsys.readouterr().err

    assert main(["exports", "check", str(tmp_path / "nofile")]) == 2
