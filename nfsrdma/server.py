"""NFSServer: an exported directory served over NFSv4.1 on TCP (and RPC-over-RDMA).

Wires the layers together: listeners → RPC dispatch (program 100003 version 4: NULL and
COMPOUND) → COMPOUND processing with the session registry, open/lock state and the VFS.

Connections are admitted up to ``ServerConfig.max_connections`` in all and
``connections_per_source`` from one address (TCP and RDMA alike); one over a limit is closed as
soon as it is accepted. A connection without session and without calls in progress is closed
when it stays idle, or leaves a record incomplete, too long (``rpc.idle``). Logs one line per
connection (and one more when the server closes it, with the reason), and one per client
session; lines a flood of connections would provoke are rate-limited, with a count of those
suppressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import nfsrdma
from nfsrdma.nfs4.callback import Callbacks
from nfsrdma.nfs4.compound import compound
from nfsrdma.nfs4.delegation_service import DelegationService
from nfsrdma.nfs4.grace import Grace
from nfsrdma.nfs4.server_state import ServerConfig, ServerState, raise_descriptor_limit
from nfsrdma.nfs4.state import StateManager
from nfsrdma.rpc.admission import ConnectionAdmission, source_of
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.gss import GssServer
from nfsrdma.rpc.gss_setup import DEFAULT_KEYTAB, security_setup
from nfsrdma.rpc.idle import IdleTimeouts
from nfsrdma.rpc.ratelog import LineRateLimiter
from nfsrdma.rpc.server import Dispatcher, RpcCall, null_procedure
from nfsrdma.rpc.watch import IdleWatch
from nfsrdma.session.server import ServerSessions, SessionCaps
from nfsrdma.stats.service import StatsService
from nfsrdma.transport.base import Connection
from nfsrdma.transport.rdma.endpoint import RdmaListener, RdmaOptions
from nfsrdma.transport.rdma.provider import Device
from nfsrdma.transport.tcp import listen_tcp
from nfsrdma.vfs.base import Export, Vfs
from nfsrdma.vfs.clientdb import ClientDb
from nfsrdma.vfs.exports import ExportsError, ExportTable
from nfsrdma.vfs.exports import load as load_exports
from nfsrdma.vfs.identity import protect_current_thread
from nfsrdma.vfs.local import LocalVfs
from nfsrdma.vfs.namespace import NamespaceVfs
from nfsrdma.vfs.secret import default_state_dir
from nfsrdma.xdr.gen import nfs4
from nfsrdma.xdr.runtime import Writer

log = logging.getLogger("nfsrdma.server")

NFS_TCP_PORT = 2049
NFS_RDMA_PORT = 20049  # RFC 8267 section 6.3 (UL-9)


class NFSServer:
    """Serve ``export`` (a directory, the pseudo-root), or with ``exports``/``exports_file``
    several exports with client rules under a pseudo-root (``vfs/namespace.py``). Use
    ``await start()`` then ``await close()``, or ``async with NFSServer(...)``."""

    def __init__(
        self,
        export: str,
        *,
        bind: str | None = None,
        tcp_port: int = NFS_TCP_PORT,
        rdma_port: int | None = NFS_RDMA_PORT,
        rdma_device: str | Device | None = None,
        rdma_options: RdmaOptions | None = None,
        read_only: bool = False,
        root_squash: bool = True,
        anon_uid: int = 65534,
        anon_gid: int = 65534,
        state_dir: str | None = None,
        lease_time: int | None = None,
        grace_time: int | None = None,
        slots: int | None = None,
        config: ServerConfig | None = None,
        session_caps: SessionCaps | None = None,
        backend: Callable[[Export], Vfs] | None = None,
        node_name: str | None = None,
        exports: ExportTable | None = None,
        exports_file: str | None = None,
        admin_socket: bool = False,
        metrics: tuple[str, int] | None = None,
        sec: tuple[str, ...] = ("sys",),
        keytab: str = DEFAULT_KEYTAB,
        gss_host: str | None = None,
        gss: GssServer | None = None,
    ) -> None:
        cfg = config or ServerConfig()
        self.security, self.gss = security_setup(sec, keytab, gss_host, gss)
        if exports is not None:  # each rule's sec= decides (vfs/namespace.py), not --sec
            self.security = None
        if lease_time is not None:
            cfg = replace(cfg, lease_time=lease_time)
        if grace_time is not None:
            cfg = replace(cfg, grace_time=grace_time)
        if slots is not None:
            cfg = replace(cfg, slots=slots)
        self.config = cfg
        self.session_caps = session_caps  # None: the defaults (nfsrdma.session.shares)
        self.backend = backend or LocalVfs  # makes the export's Vfs (e.g. CephVfs)
        # This server among those sharing a file system (its grace record): stable across
        # restarts; default host name and TCP port.
        self.node_name = node_name
        self.export = Export(
            root=export,
            read_only=read_only,
            root_squash=root_squash,
            anon_uid=anon_uid,
            anon_gid=anon_gid,
            state_dir=state_dir,
        )
        # Several exports with client rules (``vfs/exports.py``) instead of ``export`` alone;
        # ``exports_file`` is read again by ``reload_exports`` (SIGHUP).
        self.exports_file = exports_file
        if exports is None and exports_file is not None:
            exports = load_exports(exports_file)
        self.exports = exports
        self.bind = bind
        self.requested_tcp_port = tcp_port
        self.rdma_port = rdma_port  # None: no RDMA listener
        self.rdma_device = rdma_device  # a name ("rxe0"), a provider Device, or None: any
        self.rdma_options = rdma_options or RdmaOptions()
        self.rdma: RdmaListener | None = None
        self._own_device: Device | None = None
        self.state: ServerState | None = None
        self.namespace: NamespaceVfs | None = None
        self.dispatcher = Dispatcher(self.gss)
        self.connections: set[RpcConnection] = set()
        self._servers: list[asyncio.Server] = []
        self.callbacks: Callbacks | None = None
        self._reaper: asyncio.Task[None] | None = None
        self.admission = ConnectionAdmission(cfg.max_connections, cfg.connections_per_source)
        self.idle_timeouts = IdleTimeouts(cfg.idle_timeout, cfg.record_timeout)
        self.idle_closed = 0  # connections closed by the idle and record timeouts
        self._conn_lines = LineRateLimiter()  # connection opened/closed
        self._refusal_lines = LineRateLimiter()  # connection refused
        # Statistics: the admin socket in the state directory, Prometheus on ``metrics``.
        self.stats = StatsService(self, admin_socket=admin_socket, metrics=metrics)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        # The loop thread drives RDMA: it must keep its credentials (vfs/identity.py). Without
        # an RDMA listener it switches identity in place (no hand-off to the identity worker).
        if self.rdma_port is not None:
            protect_current_thread()
        vfs: Vfs
        if self.exports is not None:
            vfs = self.namespace = NamespaceVfs(self.exports, state_dir=self.export.state_dir)
            state_dir = os.path.realpath(self.export.state_dir or default_state_dir())
            clientdb = ClientDb(os.path.join(state_dir, "clients-exports.json"))
            what = ", ".join(e.path for e in self.exports.entries) or "no export"
        else:
            vfs = self.backend(self.export)
            clientdb = ClientDb.for_export(self.export, vfs.state_key())
            what = vfs.export.root
        if self.gss is not None:
            self.gss.before_accept = vfs.release_identity
        limit = raise_descriptor_limit()
        state = StateManager(
            vfs, max_open_files=cfg.open_files, state_per_client=cfg.state_per_client
        )
        node = self.node_name or f"{socket.gethostname()}:{self.requested_tcp_port}"
        grace = Grace(clientdb, cfg.grace_seconds, time.monotonic(), vfs.shared_grace(node))

        def client_expired(clientid: int) -> None:
            state.client_expired(clientid)
            grace.client_gone(clientid)

        sessions = ServerSessions.from_config(
            cfg,
            on_client_expired=client_expired,
            has_state=state.client_has_state,
            caps=self.session_caps,
        )
        self.state = ServerState(cfg, vfs, sessions, state, grace=grace, security=self.security)
        self.callbacks = Callbacks(sessions)
        sessions.on_slot_recall = self.callbacks.recall_slot
        state.notify_lock = self._notify_lock
        self.state.delegation_service = DelegationService(
            state, sessions, self.callbacks, vfs, cfg.lease_time, enabled=cfg.delegations
        )
        self.state.delegation_service.start(asyncio.get_running_loop())
        self.dispatcher.add(
            nfs4.NFS4_PROGRAM,
            nfs4.NFS_V4,
            {nfs4.NFSPROC4_NULL: null_procedure, nfs4.NFSPROC4_COMPOUND: self._compound},
        )
        # The admin socket and metrics first: once a client can connect, `nfsrdma stats` answers.
        await self.stats.start()
        srv = await listen_tcp(self.bind, self.requested_tcp_port, self._accept)
        self._servers.append(srv)
        rdma = await self._start_rdma() if self.rdma_port is not None else "off"
        grace.serving(time.monotonic())  # (reclaims can come from now: the period starts)
        log.info(
            "serving %s over NFSv4.1 and 4.2: tcp %s:%d, rdma %s%s",
            what,
            self.bind or "*",
            self.tcp_port,
            rdma,
            " (read-only)" if self.export.read_only else "",
        )
        log.info("build: %s", nfsrdma.build())  # compiled (mypyc) or pure Python (setup.py)
        log.info(
            "descriptors: %d (connections %d, %d from one address; open files %d, %d per client)",
            limit,
            cfg.max_connections,
            cfg.connections_per_source,
            state.max_open_files,
            state.state_per_client,
        )
        self._reaper = asyncio.create_task(self._reap_leases())

    async def _start_rdma(self) -> str:
        """Listen for RPC-over-RDMA when a device exists (UL-9); say where, or why not."""
        assert self.rdma_port is not None
        device = self.rdma_device
        if device is None or isinstance(device, str):
            from nfsrdma.transport.rdma.devices import find_address

            found = find_address(device, self.bind)
            if found is None:
                return "off (no RDMA device" + (f" {device})" if device else ")")
            try:
                from nfsrdma.transport.rdma.pyverbs_provider import open_device
            except ImportError as e:
                return f"off (pyverbs unavailable: {e})"
            name, address = found
            device = self._own_device = await open_device(address)
            where = f"{address}:%d on {name}"
        else:
            where = f"{device.address}:%d"
        self.rdma = RdmaListener(
            device, self.rdma_port, self._accept, self.rdma_options, screen=self._screen_rdma
        )
        await self.rdma.start()
        return where % self.rdma.port

    def reload_exports(self, table: ExportTable | None = None) -> bool:
        """Serve ``table`` (default: ``exports_file`` read again) from the next request on;
        sessions, open files and locks stay. A file that does not parse, or an export that
        cannot be opened, is refused and logged: the rules in force stay. True when applied."""
        if self.namespace is None:
            log.warning("reload: the server was not started with an exports file")
            return False
        # This runs on the loop thread, which may act as the last caller (a TCP-only server
        # switches identity in place, vfs/identity.py): read the file as the server.
        self.namespace.release_identity()
        try:
            if table is None:
                assert self.exports_file is not None
                table = load_exports(self.exports_file)
            self.namespace.reload(table)
        except (ExportsError, OSError) as e:
            log.error("exports not reloaded, the rules in force stay: %s", e)
            return False
        self.exports = table
        log.info("exports reloaded: %s", ", ".join(e.path for e in table.entries) or "none")
        return True

    @property
    def tcp_port(self) -> int:
        for srv in self._servers:
            for sock in srv.sockets:
                return int(sock.getsockname()[1])
        return self.requested_tcp_port

    async def close(self, *, drain: float = 0.0) -> None:
        """Stop listening, let the calls in progress finish and send their replies (for up to
        ``drain`` seconds; 0: do not wait), then close every connection, flushing what each
        still has to send (within the same bound)."""
        await self.stats.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for srv in self._servers:
            srv.close()
        if self.rdma is not None:
            await self.rdma.close()
        deadline = asyncio.get_running_loop().time() + drain
        if drain > 0:
            await self.dispatcher.drain(timeout=drain)
        closed = [self._closed_future(conn) for conn in list(self.connections)]
        for conn in list(self.connections):
            conn.close()
        left = deadline - asyncio.get_running_loop().time()
        if closed and left > 0:
            await asyncio.wait(closed, timeout=left)
        for srv in self._servers:
            await srv.wait_closed()
        await self.dispatcher.drain()
        if self.callbacks is not None:
            await self.callbacks.close()
        if self._own_device is not None:
            self._own_device.close()
        if self.state is not None:
            self.state.close()

    def _closed_future(self, rpc: RpcConnection) -> asyncio.Future[None]:
        """Done when the connection is closed (its pending output written, or dropped)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def closed(c: Connection, exc: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(None)

        rpc.conn.on_closed(closed)
        return fut

    async def serve_forever(self) -> None:
        await asyncio.gather(*(srv.serve_forever() for srv in self._servers))

    async def __aenter__(self) -> NFSServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- connections and calls -------------------------------------------------------------
    def _accept(self, conn: Connection) -> None:
        source = source_of(conn.peer)
        refused = self.admission.admit(source)
        if refused is not None:
            self._log_refusal(conn.kind, conn.peer, refused)
            conn.abort()
            return
        rpc = RpcConnection(conn, self.dispatcher)
        self.connections.add(rpc)
        watch = (
            IdleWatch(rpc, self.idle_timeouts, has_session=self._has_session, expired=self._expired)
            if self.idle_timeouts.enabled
            else None
        )
        self._log_limited(self._conn_lines, "%s connection from %s", conn.kind, conn.peer)

        def closed(c: Connection, exc: BaseException | None) -> None:
            self.admission.release(source)
            self.connections.discard(rpc)
            self.stats.connection_closed(c)
            if self.state is not None:
                self.state.sessions.connection_closed(rpc)
            why = (watch.reason if watch is not None else None) or exc
            if watch is not None:
                watch.stop()
            if why:
                self._log_limited(
                    self._conn_lines, "%s connection from %s closed: %s", c.kind, c.peer, why
                )
            else:
                log.debug("%s connection from %s closed", c.kind, c.peer)

        conn.on_closed(closed)

    def _screen_rdma(self, peer: str) -> bool:
        """May an RDMA connection request from ``peer`` be accepted? (Refused ones are rejected
        by the connection manager, before any resources are made for them.)"""
        refused = self.admission.refusal(source_of(peer))
        if refused is None:
            return True
        self.admission.refused += 1
        self._log_refusal("rdma", peer, refused)
        return False

    def _log_refusal(self, kind: str, peer: str, why: str) -> None:
        self._log_limited(self._refusal_lines, "%s connection from %s refused: %s", kind, peer, why)

    def _has_session(self, rpc: RpcConnection) -> bool:
        return self.state is not None and self.state.sessions.bound_to_session(rpc)

    def _expired(self, rpc: RpcConnection, why: str) -> None:
        self.idle_closed += 1
        rpc.conn.abort(ConnectionAbortedError(why))

    def _now(self) -> float:
        return time.monotonic()

    def _log_limited(self, limiter: LineRateLimiter, fmt: str, *args: object) -> None:
        """Log a line a peer can provoke, unless too many of its kind came lately."""
        suppressed = limiter.allow(self._now())
        if suppressed is None:
            return
        if suppressed:
            fmt += " (%d similar lines suppressed)"
            args = (*args, suppressed)
        log.info(fmt, *args)

    def _report_suppressed(self) -> None:
        now = self._now()
        for what, limiter in (("connection", self._conn_lines), ("refusal", self._refusal_lines)):
            suppressed = limiter.flush(now)
            if suppressed:
                log.info("%d %s lines suppressed", suppressed, what)

    def _compound(self, call: RpcCall, w: Writer) -> Awaitable[None] | None:
        assert self.state is not None
        return compound(self.state, call, w)

    def _notify_lock(self, clientid: int, fh: bytes, owner: bytes) -> None:
        if self.callbacks is not None:
            self.callbacks.notify_lock(clientid, fh, nfs4.lock_owner4(clientid, owner))

    async def _reap_leases(self) -> None:
        assert self.state is not None
        period = max(1.0, self.config.lease_time / 4)
        while True:
            await asyncio.sleep(period)
            self.state.sessions.reap(time.monotonic())
            self._report_suppressed()
            self.state.grace.tick(time.monotonic())
