"""The per-export server secret that authenticates file handles, kept in a state directory.

One secret per export, identified by the export's real path and its root's st_dev/st_ino, stored
as a 0600 JSON file in a 0700 state directory OUTSIDE the export (default: ``/var/lib/nfsrdma``
for root, as ``/var/lib/nfs`` for knfsd; otherwise ``$XDG_STATE_HOME/nfsrdma`` or
``~/.local/state/nfsrdma``). A state directory that cannot be used raises
:class:`StateDirError`, naming it. Because the secret persists, file
handles stay valid across server restarts. Creation is atomic (write a temporary file, then
``link`` it into place), so two servers starting together agree on one secret.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
from typing import Final

SECRET_SIZE: Final = 32
ROOT_STATE_DIR: Final = "/var/lib/nfsrdma"


class StateDirError(OSError):
    """The state directory (or the secret in it) cannot be created, read or trusted."""

    def __init__(self, state_dir: str, reason: str, err: int = 0) -> None:
        super().__init__(err, f"state directory {state_dir}: {reason}")
        self.state_dir = state_dir
        self.reason = reason


def default_state_dir(euid: int | None = None) -> str:
    """Where handle secrets live unless told: ``/var/lib/nfsrdma`` for root (whose home may be
    read-only), else ``$XDG_STATE_HOME/nfsrdma`` or ``~/.local/state/nfsrdma``."""
    if (os.geteuid() if euid is None else euid) == 0:
        return ROOT_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "nfsrdma")


def _is_within(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def export_secret(export_root: str, root_stat: os.stat_result, state_dir: str | None) -> bytes:
    """Load (or create) the secret of the export whose real root path is ``export_root``."""
    state = os.path.realpath(state_dir or default_state_dir())
    if _is_within(state, export_root):
        raise StateDirError(state, f"must be outside the export {export_root}", errno.EINVAL)
    try:
        return _export_secret(export_root, root_stat, state)
    except StateDirError:
        raise
    except OSError as e:
        reason = e.strerror or str(e)
        if e.filename is not None and os.fsdecode(e.filename) != state:
            reason = f"{os.fsdecode(e.filename)}: {reason}"
        raise StateDirError(state, reason, e.errno or 0) from e
    except ValueError as e:  # a damaged secret file
        raise StateDirError(state, str(e), errno.EINVAL) from e


def export_key(export_root: str, root_stat: os.stat_result) -> str:
    """A name for the files kept about one export: a hash of its real path and root inode."""
    ident = f"{export_root}\0{root_stat.st_dev}\0{root_stat.st_ino}"
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _export_secret(export_root: str, root_stat: os.stat_result, state: str) -> bytes:
    os.makedirs(state, mode=0o700, exist_ok=True)
    name = "export-" + export_key(export_root, root_stat)
    path = os.path.join(state, name + ".json")
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    record = {
        "export": export_root,
        "st_dev": root_stat.st_dev,
        "st_ino": root_stat.st_ino,
        "secret": secrets.token_hex(SECRET_SIZE),
    }
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(record, indent=1).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another server won the race: use its secret
    finally:
        os.unlink(tmp)
    return _read_secret(path)


def _read_secret(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise StateDirError(
                os.path.dirname(path),
                f"{path}: the handle secret must be a 0600 file owned by this user",
                errno.EPERM,
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            record = json.loads(f.read())
    finally:
        os.close(fd)
    value = record.get("secret") if isinstance(record, dict) else None
    if not isinstance(value, str):
        raise ValueError(f"{path}: no secret in the file")
    secret = bytes.fromhex(value)
    if len(secret) != SECRET_SIZE:
        raise ValueError(f"{path}: bad secret length")
    return secret
