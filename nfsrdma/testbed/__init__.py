"""The VM test bed: a real Linux kernel (soft-RoCE ``rxe0``, knfsd, the Linux NFS client)
booted by virtme-ng under qemu, for interop tests and baselines.

Host side: :mod:`.vm` builds and runs the ``vng`` command, :mod:`.check` says what is
missing. Guest side: :mod:`.guest` brings up rxe and knfsd and runs the command;
:mod:`.helpers` holds what tests inside the guest reuse (mount, umount, drop caches, ...).
The guest has no network device to the host: every address exists only inside it.
"""

from nfsrdma.testbed.constants import (
    ENV_ADDR,
    ENV_EXPORT,
    ENV_OUT,
    GUEST_ADDR,
    KNFSD_RDMA_PORT,
    KNFSD_TCP_PORT,
    OURS_RDMA_PORT,
    OURS_TCP_PORT,
    RXE_DEVICE,
)

__all__ = [
    "ENV_ADDR",
    "ENV_EXPORT",
    "ENV_OUT",
    "GUEST_ADDR",
    "KNFSD_RDMA_PORT",
    "KNFSD_TCP_PORT",
    "OURS_RDMA_PORT",
    "OURS_TCP_PORT",
    "RXE_DEVICE",
]
