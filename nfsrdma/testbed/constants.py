"""Names and numbers shared by the host side, the guest side and the tests."""

from __future__ import annotations

from typing import Final

# Guest-internal network: a dummy interface carrying rxe0. Nothing outside the guest sees it.
GUEST_ADDR: Final = "10.77.0.1"
GUEST_PREFIX_LEN: Final = 24
NETDEV: Final = "tbdummy0"
RXE_DEVICE: Final = "rxe0"

# knfsd listeners (RFC 8267 §6.3 / UL-9: NFS over RDMA on 20049, no rpcbind needed).
KNFSD_RDMA_PORT: Final = 20049
KNFSD_TCP_PORT: Final = 2049
# Suggested ports for our own server run inside the guest next to knfsd.
OURS_RDMA_PORT: Final = 20050
OURS_TCP_PORT: Final = 2050

# knfsd's export: a tmpfs, exported as the NFSv4 pseudo-root (fsid=0): clients mount ADDR:/.
EXPORT_DIR: Final = "/srv/nfsrdma-export"
EXPORT_SIZE: Final = "1g"
EXPORT_OPTIONS: Final = "rw,sync,no_root_squash,insecure,fsid=0,no_subtree_check"
# Shortest values knfsd accepts (seconds).
KNFSD_LEASE_TIME: Final = 10
KNFSD_GRACE_TIME: Final = 10
KNFSD_THREADS: Final = 8
RPC_PIPEFS: Final = "/run/rpc_pipefs"

# Environment of the command run in the guest.
ENV_ADDR: Final = "TESTBED_ADDR"  # guest-internal address of rxe0 and knfsd
ENV_EXPORT: Final = "TESTBED_EXPORT"  # directory knfsd exports (only with --knfsd)
ENV_OUT: Final = "TESTBED_OUT"  # writable results directory, shared with the host
ENV_RXE: Final = "TESTBED_RXE"  # the soft-RoCE device name

# Files the host and the guest exchange in the out directory.
OUT_MARKER: Final = ".nfsrdma-testbed-out"
SPEC_FILE: Final = ".testbed-spec.json"
SHELL_SCRIPT: Final = ".testbed-shell.sh"
TIMINGS_FILE: Final = "testbed.json"
KERNEL_LOG: Final = "kernel.log"
CONSOLE_LOG: Final = "console.log"
JUNIT_FILE: Final = "junit-testbed.xml"
