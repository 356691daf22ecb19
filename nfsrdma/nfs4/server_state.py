"""Everything one NFSv4.1 server instance keeps, shared by all its COMPOUNDs."""

from __future__ import annotations

import contextlib
import resource
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from nfsrdma.nfs4.grace import Grace, MemoryStore
from nfsrdma.nfs4.offload import Offloads
from nfsrdma.stats.core import ServerStats
from nfsrdma.vfs.base import Vfs
from nfsrdma.vfs.resolver import default_fd_cache_size

if TYPE_CHECKING:
    from nfsrdma.nfs4.delegation_service import DelegationService
    from nfsrdma.nfs4.state import StateManager
    from nfsrdma.session.server import ServerSessions

MiB = 1 << 20


RESERVED_DESCRIPTORS: Final = 256  # logs, listeners, the state directory, pipes, libraries


def descriptor_limit() -> int:
    """The process's descriptor limit (RLIMIT_NOFILE, soft), capped at 2**20."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        return 1 << 20
    return soft


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (``nfsrdma serve`` does, before the
    defaults below are computed); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return descriptor_limit()


def _descriptor_shares() -> tuple[int, int]:
    """How the descriptor limit is shared out by default: after a reserve and the VFS's
    cache of handle descriptors (``vfs/resolver.py``), half of the rest for connections and
    a quarter for open files (an open holds one descriptor, its delegation's lease may hold
    another): (connections, open files)."""
    rest = descriptor_limit() - RESERVED_DESCRIPTORS - default_fd_cache_size()
    return max(16, rest // 2), max(16, rest // 4)


def default_max_connections() -> int:
    """Connections the server admits by default: half of what the descriptor limit leaves
    after the reserve and the VFS's descriptor cache (see ``_descriptor_shares``)."""
    return _descriptor_shares()[0]


def default_max_open_files() -> int:
    """Opens (each holding a descriptor) the server keeps at once by default, all clients
    together; delegations are limited to as many (see ``_descriptor_shares``)."""
    return _descriptor_shares()[1]


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
    io_threads: int = 8  # thread pool for large READ/WRITE/COMMIT and long READDIRs
    large_io: int = 64 * 1024  # I/O at least this large runs in the thread pool
    readdir_inline: int = 64  # entries a READDIR lists on the event loop; more: thread pool
    server_owner: bytes = b""  # so_major_id; default: derived from the host name
    server_scope: bytes = b""  # default: the host name
    delegations: bool = True  # grant read/write delegations (nfsrdma serve --no-delegations)
    grace_time: int | None = None  # seconds of grace after a restart; default: lease_time
    # Connections (TCP and RDMA together); over either limit a new one is closed at once.
    max_connections: int = field(default_factory=default_max_connections)
    max_connections_per_source: int = 0  # per source address; 0: see connections_per_source
    # Open files (all clients) and stateids of one client (opens and lock stateids): over
    # either, a new OPEN or lock stateid gets NFS4ERR_DELAY, so that no client can take the
    # descriptors every other client needs (nfsrdma serve --max-open-files, --max-state-per-
    # client).
    max_open_files: int = 0  # 0: see open_files
    max_state_per_client: int = 0  # 0: see state_per_client
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
    def open_files(self) -> int:
        """The open-file budget: as configured, else from the descriptor limit in force
        (the server raises it when it starts, before it reads this)."""
        return self.max_open_files if self.max_open_files > 0 else default_max_open_files()

    @property
    def state_per_client(self) -> int:
        """The share of one client: as configured, else a quarter of the open files (at
        least 16, at most all)."""
        if self.max_state_per_client > 0:
            return self.max_state_per_client
        budget = self.open_files
        return min(budget, max(16, budget // 4))

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
