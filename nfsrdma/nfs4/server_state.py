"""Everything one NFSv4.1 server instance keeps, shared by all its COMPOUNDs."""

from __future__ import annotations

import resource
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nfsrdma.nfs4.grace import Grace, MemoryStore
from nfsrdma.nfs4.offload import Offloads
from nfsrdma.stats.core import ServerStats
from nfsrdma.vfs.base import Vfs

if TYPE_CHECKING:
    from nfsrdma.nfs4.delegation_service import DelegationService
    from nfsrdma.nfs4.state import StateManager
    from nfsrdma.session.server import ServerSessions

MiB = 1 << 20


def default_max_connections() -> int:
    """Connections the server admits by default: what the descriptor limit (RLIMIT_NOFILE)
    allows after keeping a quarter of it, and at least 256 descriptors, for the VFS (open
    files, cached directories) and everything else the process opens."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(16, soft - max(256, soft // 4))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Limits and policies of the NFSv4.1 service (the export's own options live in Export)."""

    lease_time: int = 90  # seconds (fattr4_lease_time)
    slots: int = 64  # fore-channel slots per session (ca_maxrequests ceiling)
    max_io: int = MiB  # maxread / maxwrite
    max_request_size: int = MiB + 16 * 1024  # ca_maxrequestsize ceiling
    max_response_size: int = MiB + 16 * 1024  # ca_maxresponsesize ceiling
    max_response_size_cached: int = 64 * 1024  # ca_maxresponsesize_cached ceiling
    max_operations: int = 64  # ca_maxoperations ceiling
    back_slots: int = 4  # back-channel slots we accept
    io_threads: int = 8  # thread pool for large READ/WRITE/COMMIT
    large_io: int = 64 * 1024  # I/O at least this large runs in the thread pool
    server_owner: bytes = b""  # so_major_id; default: derived from the host name
    server_scope: bytes = b""  # default: the host name
    delegations: bool = True  # grant read/write delegations (nfsrdma serve --no-delegations)
    grace_time: int | None = None  # seconds of grace after a restart; default: lease_time
    # Connections (TCP and RDMA together); over either limit a new one is closed at once.
    max_connections: int = field(default_factory=default_max_connections)
    max_connections_per_source: int = 0  # per source address; 0: see connections_per_source
    idle_timeout: float = 300.0  # close a connection without session or call idle this long
    record_timeout: float = 30.0  # ... or whose first/current record is not complete this long

    @property
    def connections_per_source(self) -> int:
        """The share of one source address: as configured, else a quarter of all (at least 16,
        at most all)."""
        if self.max_connections_per_source > 0:
            return self.max_connections_per_source
        return min(self.max_connections, max(16, self.max_connections // 4))

    @property
    def grace_seconds(self) -> int:
        return self.lease_time if self.grace_time is None else self.grace_time


@dataclass
class ServerState:
    config: ServerConfig
    vfs: Vfs
    sessions: ServerSessions
    state_manager: StateManager  # opens, byte-range locks, delegations and their stateids
    # Client records and the grace period after a restart (none unless the server sets one).
    grace: Grace = field(default_factory=lambda: Grace(MemoryStore(), 0, 0.0))
    executor: ThreadPoolExecutor = field(init=False)
    delegation_service: DelegationService | None = None  # set by the server once it runs
    offloads: Offloads = field(default_factory=Offloads)  # asynchronous COPYs (NFSv4.2)
    stats: ServerStats = field(default_factory=ServerStats)  # operations by transport
    # RFC 2623 pseudo-flavours the export accepts, in SECINFO order (None: AUTH_SYS and
    # AUTH_NONE, nothing refused with NFS4ERR_WRONGSEC)
    security: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.state_manager.leases = self.sessions  # courteous clients (nfsrdma.session.server)
        self.executor = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="nfsrdma-io")

    def close(self) -> None:
        self.offloads.cancel_all()
        if self.delegation_service is not None:
            self.delegation_service.close()
        self.state_manager.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.vfs.close()
