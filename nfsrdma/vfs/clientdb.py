"""The stable client records of one export (RFC 8881 section 8.4.2.1), on disk.

The disk side of ``nfsrdma.nfs4.grace.RecordStore``: a 0600 JSON file in the state directory
next to the export's handle secret (``secret.py`` finds the directory), named after the
export, holding the hex co_ownerids of the recorded clients. Every change rewrites the whole
file (there are few clients) atomically: a temporary file is written and fsynced, renamed over
the old one, and the directory is fsynced, so a crash leaves the old records or the new ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from typing import Final

from nfsrdma.vfs.base import Export
from nfsrdma.vfs.identity import FsIdentity
from nfsrdma.vfs.secret import StateDirError, default_state_dir, export_key

FORMAT: Final = 1


class ClientDb:
    """The client records in ``path``. Read and written as the server itself: the calling
    thread may last have acted for a client (``identity``: fs ids are per thread and cached),
    and a squashed client may not write the 0700 state directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._ident = FsIdentity()

    @classmethod
    def for_export(cls, export: Export, key: str | None = None) -> ClientDb:
        """The records of ``export``; ``key`` names them (``Vfs.state_key``) when the export
        is not a local directory."""
        state = os.path.realpath(export.state_dir or default_state_dir())
        if key is None:
            root = os.path.realpath(export.root)
            key = export_key(root, os.stat(root))
        name = "clients-" + key + ".json"
        return cls(os.path.join(state, name))

    def load(self) -> set[bytes]:
        self._ident.apply_server()
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return set()
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise StateDirError(
                    os.path.dirname(self.path),
                    f"{self.path}: the client records must be a 0600 file owned by this user",
                )
            with os.fdopen(os.dup(fd), "rb") as f:
                record = json.loads(f.read())
        finally:
            os.close(fd)
        owners = record.get("clients") if isinstance(record, dict) else None
        if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
            raise StateDirError(os.path.dirname(self.path), f"{self.path}: damaged records")
        return {bytes.fromhex(o) for o in owners}

    def save(self, owners: set[bytes]) -> None:
        self._ident.apply_server()
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        data = json.dumps({"format": FORMAT, "clients": sorted(o.hex() for o in owners)})
        tmp = f"{self.path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                os.write(fd, data.encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
