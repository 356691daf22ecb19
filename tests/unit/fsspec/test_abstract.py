"""fsspec's own conformance tests (``fsspec.tests.abstract``) against ``nfs://`` and our server
on TCP loopback: copy, get, put, open and pipe, with the fixtures those classes ask for."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import fsspec.tests.abstract as abstract
import pytest

from tests.unit.client.ourserver import OurServer


class NfsFixtures(abstract.AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, nfs_server: OurServer) -> Any:
        return fsspec.filesystem("nfs", host="127.0.0.1", port=nfs_server.port)

    @pytest.fixture
    def fs_join(self) -> Callable[..., str]:
        return posixpath.join

    @pytest.fixture
    def fs_path(self, fs: Any) -> Iterator[str]:
        path = f"/abstract-{uuid.uuid4().hex[:8]}"
        fs.mkdir(path)
        yield path
        fs.rm(path, recursive=True)


class TestNfsCopy(abstract.AbstractCopyTests, NfsFixtures):  # type: ignore[misc]
    pass


class TestNfsGet(abstract.AbstractGetTests, NfsFixtures):  # type: ignore[misc]
    pass


class TestNfsPut(abstract.AbstractPutTests, NfsFixtures):  # type: ignore[misc]
    pass


class TestNfsOpen(abstract.AbstractOpenTests, NfsFixtures):  # type: ignore[misc]
    pass


class TestNfsPipe(abstract.AbstractPipeTests, NfsFixtures):  # type: ignore[misc]
    pass


def test_every_abstract_test_class_runs() -> None:
    """When fsspec adds a test class, it is run here too (this fails until it is)."""
    names = {n for n in dir(abstract) if n.startswith("Abstract") and n.endswith("Tests")}
    ran = {
        base.__name__
        for cls in (TestNfsCopy, TestNfsGet, TestNfsPut, TestNfsOpen, TestNfsPipe)
        for base in cls.__mro__
    }
    assert names <= ran, names - ran
