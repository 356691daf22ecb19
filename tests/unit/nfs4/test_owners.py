"""Owner names are looked up in the name service once, then answered from a bounded cache (a
lookup may block the event loop): found and unknown names alike, per user and group, until
the answer is older than the TTL."""

from __future__ import annotations

import grp
import pwd
from collections.abc import Iterator

import pytest

from nfsrdma.nfs4 import owners
from nfsrdma.nfs4.attrs import parse_owner
from nfsrdma.nfs4.context import Nfs4Error
from nfsrdma.xdr.gen import nfs4


@pytest.fixture
def nss_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The real name service, with each call to it counted."""
    calls: list[str] = []
    getpwnam, getgrnam = pwd.getpwnam, grp.getgrnam

    def counted_pw(name: str) -> pwd.struct_passwd:
        calls.append("pw:" + name)
        return getpwnam(name)

    def counted_gr(name: str) -> grp.struct_group:
        calls.append("gr:" + name)
        return getgrnam(name)

    monkeypatch.setattr(pwd, "getpwnam", counted_pw)
    monkeypatch.setattr(grp, "getgrnam", counted_gr)
    owners.clear()
    yield calls
    owners.clear()


def test_found_names_are_looked_up_once(nss_calls: list[str]) -> None:
    for _ in range(3):
        assert parse_owner(b"root@example.org", group=False) == 0
        assert parse_owner(b"root", group=True) == 0
    assert nss_calls == ["pw:root", "gr:root"]


def test_unknown_names_are_cached_too(nss_calls: list[str]) -> None:
    for _ in range(3):
        with pytest.raises(Nfs4Error) as e:
            parse_owner(b"no-such-user-nfsrdma", group=False)
        assert e.value.status == nfs4.NFS4ERR_BADOWNER
    assert nss_calls == ["pw:no-such-user-nfsrdma"]


def test_digits_never_reach_the_name_service(nss_calls: list[str]) -> None:
    assert parse_owner(b"1000", group=False) == 1000
    assert nss_calls == []


def test_an_answer_is_asked_again_after_the_ttl(nss_calls: list[str]) -> None:
    assert owners.lookup("root", group=False, now=100.0) == 0
    assert owners.lookup("root", group=False, now=100.0 + owners.TTL - 1) == 0
    assert owners.lookup("root", group=False, now=100.0 + owners.TTL + 1) == 0
    assert nss_calls == ["pw:root", "pw:root"]


def test_the_cache_is_bounded(nss_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owners, "MAX_ENTRIES", 8)
    for i in range(50):
        owners.lookup(f"nobody-{i}", group=False, now=1.0)
    assert len(owners._cache) <= 8
