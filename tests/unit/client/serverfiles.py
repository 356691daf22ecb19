"""Reaching a test server's files from beside it, as a local process would: through the
export directory on disk, or for a CephFS-backed server through a second CephFS client
(Debian's python3-cephfs), which Ceph keeps coherent with the server's own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class ServerFiles:
    def __init__(self, export_dir: Path | None, ceph_conf: Path | None) -> None:
        if export_dir is None and ceph_conf is None:
            raise AssertionError("the test needs the server's files (VFS Ganesha: root)")
        self.export_dir = export_dir
        self._fs: Any = None
        if export_dir is None:
            import cephfs  # type: ignore[import-not-found]

            self._fs = cephfs.LibCephFS(conffile=str(ceph_conf))
            self._fs.mount()

    def overwrite(self, rel: str, offset: int, data: bytes) -> None:
        if self._fs is None:
            assert self.export_dir is not None
            with open(self.export_dir / rel, "r+b") as f:
                f.seek(offset)
                f.write(data)
            return
        fd = self._fs.open("/" + rel, os.O_RDWR)
        try:
            self._fs.write(fd, data, offset)
            self._fs.fsync(fd, 0)
        finally:
            self._fs.close(fd)

    def read(self, rel: str) -> bytes:
        if self._fs is None:
            assert self.export_dir is not None
            return (self.export_dir / rel).read_bytes()
        size = self._fs.stat("/" + rel).st_size
        fd = self._fs.open("/" + rel, os.O_RDONLY)
        try:
            return bytes(self._fs.read(fd, 0, size))
        finally:
            self._fs.close(fd)

    def close(self) -> None:
        if self._fs is not None:
            self._fs.unmount()
            self._fs.shutdown()
