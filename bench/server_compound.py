"""Server CPU per COMPOUND, in process: the NFSv4.1 server's COMPOUND processing (decode, run,
encode) with no transport, on the real local VFS over a temporary directory.

Three COMPOUNDs the Linux client sends most, each on a fresh slot sequence so every one runs
(no reply-cache hit):
1. SEQUENCE + PUTFH + GETATTR (the 15 attributes of nfs4_fattr_bitmap);
2. SEQUENCE + PUTFH + READ of 4 KiB (served inline, below the thread-pool threshold);
3. SEQUENCE + PUTFH + SETATTR(mode) + GETATTR.
Last line: ``getattr_us=… read_us=… setattr_us=…`` (microseconds of CPU per COMPOUND, best
of ``--repeat`` runs; lower is better).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from attr_encode import linux_getattr_bitmap

from nfsrdma.nfs4.attrs import bitmap_of
from nfsrdma.nfs4.inprocess import ROOT_CRED, CompoundDriver, argop, local_state
from nfsrdma.nfs4.server_state import ServerState
from nfsrdma.vfs import LocalVfs
from nfsrdma.xdr.gen import nfs4, rpc

OK = nfs4.NFS4_OK
LINUX_BITMAP = linux_getattr_bitmap()
_op = argop  # (the name bench/server_cpu.py and bench/profile_compound.py import)


def open_op(
    name: bytes, owner: nfs4.open_owner4, access: int, flag: nfs4.openflag4
) -> nfs4.nfs_argop4:
    """OPEN of ``name`` in the current directory by ``owner`` (CLAIM_NULL, deny none)."""
    claim = nfs4.open_claim4(nfs4.CLAIM_NULL, name)
    args = nfs4.OPEN4args(0, access, nfs4.OPEN4_SHARE_DENY_NONE, owner, flag, claim)
    return _op(nfs4.OP_OPEN, args)


class Bench(CompoundDriver):
    """The in-process driver (``nfsrdma.nfs4.inprocess``) over a fresh local export in
    ``root``, with the names the benchmarks use."""

    def __init__(
        self,
        root: Path,
        *,
        watch_moves: bool = True,
        cred: rpc.opaque_auth = ROOT_CRED,
        root_squash: bool = False,
    ) -> None:
        (root / "export").mkdir()
        state = local_state(root, watch_moves=watch_moves, root_squash=root_squash)
        super().__init__(state, peer="bench", cred=cred)  # cred: what every request carries
        vfs = self.state.vfs
        assert isinstance(vfs, LocalVfs)
        self.vfs = vfs

    @property
    def server(self) -> ServerState:
        return self.state

    async def create_file(
        self, dir_fh: bytes, name: bytes = b"file", data: bytes = b""
    ) -> tuple[bytes, nfs4.stateid4]:
        """``name`` created in ``dir_fh`` (OPEN UNCHECKED4 for reading and writing by owner
        "bench", left open), then ``data`` written to it (FILE_SYNC4) unless empty: the file's
        handle and its open stateid."""
        unchecked = nfs4.createhow4(nfs4.UNCHECKED4, nfs4.fattr4(bitmap_of([]), b""))
        owner = nfs4.open_owner4(1, b"bench")
        access, create = nfs4.OPEN4_SHARE_ACCESS_BOTH, nfs4.openflag4(nfs4.OPEN4_CREATE, unchecked)
        created = await self.result(
            [
                self.sequence(),
                _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(dir_fh)),
                open_op(name, owner, access, create),
                _op(nfs4.OP_GETFH),
            ]
        )
        fh: bytes = created.resarray[3].value.value.object
        stateid: nfs4.stateid4 = created.resarray[2].value.value.stateid
        if data:
            write = nfs4.WRITE4args(stateid, 0, nfs4.FILE_SYNC4, data)
            await self.result(
                [
                    self.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_WRITE, write),
                ]
            )
        return fh, stateid


async def time_compounds(bench: Bench, make: Callable[[], list[nfs4.nfs_argop4]], n: int) -> float:
    """Microseconds of process CPU per COMPOUND (requests are encoded beforehand)."""
    requests = [bench.request(make()) for _ in range(n)]
    t0 = time.process_time_ns()
    for data in requests:
        await bench.send(data)
    return (time.process_time_ns() - t0) / n / 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=20000, help="COMPOUNDs per measure")
    ap.add_argument("--repeat", type=int, default=5, help="measures; the best is kept")
    return asyncio.run(measure(ap.parse_args()))


async def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        try:
            root_fh = await bench.mount()
            fh, stateid = await bench.create_file(root_fh, data=bytes(range(256)) * 16)
            mode = nfs4.fattr4(bitmap_of([nfs4.FATTR4_MODE]), (0o644).to_bytes(4, "big"))

            def getattr_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
                ]

            def read_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_READ, nfs4.READ4args(stateid, 0, 4096)),
                ]

            def setattr_ops() -> list[nfs4.nfs_argop4]:
                return [
                    bench.sequence(),
                    _op(nfs4.OP_PUTFH, nfs4.PUTFH4args(fh)),
                    _op(nfs4.OP_SETATTR, nfs4.SETATTR4args(stateid, mode)),
                    _op(nfs4.OP_GETATTR, nfs4.GETATTR4args(LINUX_BITMAP)),
                ]

            for make in (getattr_ops, read_ops, setattr_ops):  # each must succeed
                await bench.result(make())
            figures = {}
            for key, make in (
                ("getattr_us", getattr_ops),
                ("read_us", read_ops),
                ("setattr_us", setattr_ops),
            ):
                figures[key] = min(
                    [await time_compounds(bench, make, args.count) for _ in range(args.repeat)]
                )
                print(f"{key[:-3]:>8}: {figures[key]:7.2f} us CPU per COMPOUND", flush=True)
        finally:
            bench.server.close()
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
