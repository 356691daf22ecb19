"""Everything one NFSv4.1 server instance keeps, shared by all its COMPOUNDs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nfsrdma.vfs.base import Vfs

if TYPE_CHECKING:
    from nfsrdma.nfs4.delegation_service import DelegationService
    from nfsrdma.nfs4.state import StateManager
    from nfsrdma.session.server import ServerSessions

MiB = 1 << 20


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


@dataclass
class ServerState:
    config: ServerConfig
    vfs: Vfs
    sessions: ServerSessions
    state: StateManager
    executor: ThreadPoolExecutor = field(init=False)
    delegation_service: DelegationService | None = None  # set by the server once it runs

    def __post_init__(self) -> None:
        self.executor = ThreadPoolExecutor(self.config.io_threads, thread_name_prefix="nfsrdma-io")

    def close(self) -> None:
        if self.delegation_service is not None:
            self.delegation_service.close()
        self.state.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.vfs.close()
