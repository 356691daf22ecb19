"""The Linux NFS client against knfsd inside the guest, over RDMA and over TCP."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from nfsrdma.testbed.helpers import Knfsd, MountFactory, Proto, drop_caches, sha256_file

pytestmark = pytest.mark.testbed

SIZE = 16 << 20
CHUNK = 1 << 20


@pytest.mark.parametrize("proto", ["rdma", "tcp"])
def test_linux_client_write_read_16mib(knfsd: Knfsd, nfs_mount: MountFactory, proto: Proto) -> None:
    """UL-9: knfsd serves NFSv4.1 on RDMA 20049 (and TCP 2049); the Linux client writes
    16 MiB, drops its caches, reads the file back over the wire, and the checksums match."""
    mount = nfs_mount(knfsd.server(proto))
    stats = mount.stats()
    assert stats.xprt == proto  # /proc/self/mountstats: "xprt: rdma ..." / "xprt: tcp ..."
    assert stats.opts.get("vers") == "4.1"
    assert stats.opts.get("proto") == proto
    # The kernel lists port= only when it is not the default 2049.
    assert stats.opts.get("port", "2049") == str(knfsd.server(proto).port)

    name = f"blob-{proto}"
    written = hashlib.sha256()
    fd = os.open(mount.mountpoint / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(SIZE // CHUNK):
            block = os.urandom(CHUNK)
            written.update(block)
            assert os.write(fd, block) == CHUNK
        os.fsync(fd)
    finally:
        os.close(fd)

    # The server's own view of the file (its tmpfs export).
    on_server = Path(knfsd.export) / name
    assert on_server.stat().st_size == SIZE
    assert sha256_file(on_server) == written.hexdigest()

    drop_caches()
    before = mount.stats().server_read_bytes
    assert sha256_file(mount.mountpoint / name) == written.hexdigest()
    after = mount.stats()
    assert after.server_read_bytes - before >= SIZE, "the read-back did not go to the server"
    assert after.xprt == proto
