"""Keeping every access inside the export.

* Names are single components: no ``""``, ``"."``, ``".."``, ``"/"`` or NUL, at most 255 octets.
* Components are opened relative to a directory descriptor with ``O_PATH | O_NOFOLLOW``: the
  server never follows symlinks (clients resolve them); a symlink is an object of its own.
* A directory reached through a kernel file handle is accepted only if walking ``..`` from it
  reaches the export root (a directory moved out of the export by a local process is stale).
"""

from __future__ import annotations

import errno
import os
from typing import Final

from nfsrdma.vfs.base import NAME_MAX

O_PATH_NOFOLLOW: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH: Final = 4096


def check_name(name: bytes | str) -> bytes:
    """Validate one component; returns it as bytes. EINVAL or ENAMETOOLONG otherwise."""
    b = os.fsencode(name) if isinstance(name, str) else name
    if not isinstance(b, bytes):
        raise OSError(errno.EINVAL, "name must be bytes")
    if b in (b"", b".", b"..") or b"/" in b or b"\0" in b:
        raise OSError(errno.EINVAL, f"invalid name {b!r}")
    if len(b) > NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, "name longer than 255 octets")
    return b


def open_component(dirfd: int, name: bytes) -> int:
    """O_PATH descriptor of ``name`` in ``dirfd`` itself (symlinks are not followed)."""
    return os.open(name, O_PATH_NOFOLLOW, dir_fd=dirfd)


def proc_path(fd: int) -> str:
    """The /proc magic link that reopens ``fd``'s object with a permission check."""
    return f"/proc/self/fd/{fd}"


def within_root(fd: int, root: tuple[int, int]) -> bool:
    """Whether the directory ``fd`` lies under the directory identified by ``root`` (dev, ino).

    Walks ``..`` (at most :data:`MAX_DEPTH` levels) with the caller's identity.
    """
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) == root:
        return True
    try:
        cur = _parent(fd)
    except FileNotFoundError:
        return False  # outside the export's (cloned) mount: the kernel refuses ".."
    try:
        for _ in range(MAX_DEPTH):
            pst = os.fstat(cur)
            if (pst.st_dev, pst.st_ino) == root:
                return True
            if (pst.st_dev, pst.st_ino) == (st.st_dev, st.st_ino):
                return False  # reached a root without meeting the export
            try:
                nxt = _parent(cur)
            except FileNotFoundError:
                return False
            os.close(cur)
            cur, st = nxt, pst
        return False
    finally:
        os.close(cur)


def _parent(fd: int) -> int:
    return os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
