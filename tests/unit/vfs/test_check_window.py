"""The confinement check window (vfs/confine.py): while a COMPOUND runs without waiting, each
descriptor is checked to be inside the export once; the window closes when the COMPOUND ends
or must wait, and belongs to one thread. Outside a window, every use is checked.

Tests here move objects out of the export with a local process while a window is open (which
the window deliberately trusts) and check that closing it, another thread, the end of a COMPOUND
and a COMPOUND that waits all bring the check back.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.vfs import LocalVfs, StaleHandle, confine
from nfsrdma.xdr.gen import nfs4

from ..nfs4.wire import Client, build, close
from ..session.helpers import op
from .conftest import ROOT, MakeVfs, needs_root

pytestmark = needs_root
MODES = [
    pytest.param({}, id="kernel-clone"),
    pytest.param({"clone_mount": False}, id="kernel-noclone"),
    pytest.param({"handle_mode": "cache"}, id="cache-clone"),
    pytest.param({"handle_mode": "cache", "clone_mount": False}, id="cache-noclone"),
]


def _moved_dir(vfs: LocalVfs, export: Path, outside: Path) -> bytes:
    (export / "d").mkdir()
    fh = vfs.lookup(ROOT, vfs.root_handle(), "d")
    vfs.check(fh)  # its descriptor is cached now
    return fh


@pytest.mark.parametrize("options", MODES)
def test_a_window_checks_once_and_closing_it_checks_again(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    vfs = make_vfs(root_squash=False, **options)
    outside = tmp_path / "outside"
    outside.mkdir()
    fh = _moved_dir(vfs, export_dir, outside)
    confine.open_window()
    try:
        vfs.check(fh)  # checked: inside
        os.rename(export_dir / "d", outside / "d")  # a local process moves it out
        vfs.check(fh)  # trusted for the rest of the window (as between a check and its use)
        assert vfs.getattr(fh).type is not None
    finally:
        confine.close_window()
    with pytest.raises(StaleHandle):
        vfs.check(fh)
    with pytest.raises(StaleHandle):
        vfs.getattr(fh)


def test_a_window_is_the_opening_threads_only(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path
) -> None:
    vfs = make_vfs(root_squash=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    fh = _moved_dir(vfs, export_dir, outside)
    confine.open_window()
    try:
        vfs.check(fh)
        os.rename(export_dir / "d", outside / "d")
        with ThreadPoolExecutor(1) as other:
            failed = other.submit(vfs.check, fh).exception()
        assert isinstance(failed, StaleHandle)
    finally:
        confine.close_window()


def test_a_descriptor_dropped_in_a_window_is_resolved_and_checked_again(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path
) -> None:
    vfs = make_vfs(root_squash=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    fh = _moved_dir(vfs, export_dir, outside)
    confine.open_window()
    try:
        vfs.check(fh)
        os.rename(export_dir / "d", outside / "d")
        vfs._res.forget(fh)  # as REMOVE / RENAME through the server do
        with pytest.raises(StaleHandle):
            vfs.check(fh)
    finally:
        confine.close_window()


@pytest.mark.parametrize("options", MODES)
def test_what_lookup_opened_in_a_window_counts_as_checked_until_it_closes(
    make_vfs: MakeVfs, export_dir: Path, tmp_path: Path, options: dict[str, Any]
) -> None:
    vfs = make_vfs(root_squash=False, **options)
    outside = tmp_path / "outside"
    outside.mkdir()
    (export_dir / "f").write_bytes(b"data")
    confine.open_window()
    try:
        f = vfs.lookup(ROOT, vfs.root_handle(), "f")  # opened by name in the root
        os.rename(export_dir / "f", outside / "f")
        assert vfs.getattr(f).size == 4  # not checked again in this window
    finally:
        confine.close_window()
    with pytest.raises(StaleHandle):
        vfs.getattr(f)
    confine.open_window()
    try:
        with pytest.raises(StaleHandle):  # a new window checks afresh
            vfs.check(f)
    finally:
        confine.close_window()


# -- through COMPOUNDs ----------------------------------------------------------------------


class GatedExecutor(ThreadPoolExecutor):
    """The server's I/O pool, holding each job until the test lets it go."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = threading.Event()
        self.go = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        def gated() -> Any:
            self.go.wait(30)
            return fn(*args, **kwargs)

        future = super().submit(gated)
        self.submitted.set()
        return future


def _putfh(fh: bytes) -> nfs4.nfs_argop4:
    return op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh))


def _getattr() -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETATTR, nfs4.GETATTR4args(bitmap_of([nfs4.FATTR4_TYPE])))


def _open_create(name: bytes) -> nfs4.nfs_argop4:
    how = nfs4.createhow4(nfs4.UNCHECKED4, nfs4.fattr4([], b""))
    return op(
        nfs4.OP_OPEN,
        nfs4.OPEN4args(
            0,
            nfs4.OPEN4_SHARE_ACCESS_BOTH,
            nfs4.OPEN4_SHARE_DENY_NONE,
            nfs4.open_owner4(0, b"window"),
            nfs4.openflag4(nfs4.OPEN4_CREATE, how),
            nfs4.open_claim4(nfs4.CLAIM_NULL, name),
        ),
    )


async def test_each_compound_checks_afresh_and_a_waiting_one_too(tmp_path: Path) -> None:
    srv = build(tmp_path)
    export, outside = tmp_path / "export", tmp_path / "outside"
    outside.mkdir()
    gate = GatedExecutor()
    srv.state.executor.shutdown()
    srv.state.executor = gate
    try:
        c = await Client(srv, b"window").mount()
        res = await c.expect(
            nfs4.NFS4_OK, op(nfs4.OP_PUTROOTFH), _open_create(b"f"), op(nfs4.OP_GETFH)
        )
        sid, fh = c.value(res, 2).stateid, c.value(res, 3).object
        await c.expect(nfs4.NFS4_OK, _putfh(fh), _getattr())  # its descriptor is hot

        # A WRITE large enough for the I/O pool waits there; meanwhile a local process moves
        # the file out. The GETATTR after the WRITE must check again: STALE.
        big = nfs4.WRITE4args(sid, 0, nfs4.UNSTABLE4, bytes(srv.state.config.large_io))
        task = asyncio.ensure_future(c.call(_putfh(fh), op(nfs4.OP_WRITE, big), _getattr()))
        await asyncio.to_thread(gate.submitted.wait, 30)
        os.rename(export / "f", outside / "f")
        gate.go.set()
        res = await task
        assert [r.resop for r in res.resarray][-2:] == [nfs4.OP_WRITE, nfs4.OP_GETATTR]
        assert res.status == nfs4.NFS4ERR_STALE

        # Back inside, then out again between two COMPOUNDs: the second PUTFH checks.
        os.rename(outside / "f", export / "f")
        await c.expect(nfs4.NFS4_OK, _putfh(fh), _getattr())
        os.rename(export / "f", outside / "f")
        await c.expect(nfs4.NFS4ERR_STALE, _putfh(fh))
    finally:
        close(srv)
