"""`nfsrdma serve DIR` (or `--exports FILE`): export directories over NFSv4.1 and NFSv4.2."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nfsrdma import sdnotify
from nfsrdma.aio import run
from nfsrdma.nfs4.server_state import ServerConfig, raise_descriptor_limit
from nfsrdma.rpc.auth import KRB5, KRB5I, KRB5P
from nfsrdma.rpc.gss_setup import DEFAULT_KEYTAB, SecuritySetupError, parse_sec, security_setup
from nfsrdma.server import NFS_RDMA_PORT, NFS_TCP_PORT, NFSServer
from nfsrdma.stats.service import parse_address
from nfsrdma.transport.rdma.connection_base import RdmaOptions
from nfsrdma.vfs.base import Export, Vfs
from nfsrdma.vfs.exports import ExportsError, ExportTable, check_paths
from nfsrdma.vfs.exports import load as load_exports
from nfsrdma.vfs.secret import StateDirError

log = logging.getLogger("nfsrdma.server")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="export a directory over NFSv4.1/4.2 (TCP and RDMA)")
    p.add_argument(
        "directory",
        nargs="?",
        help="the directory to export (the NFSv4 pseudo-root); none with --exports or --cephfs",
    )
    ceph = p.add_argument_group("CephFS backend (serve a CephFS directory through libcephfs)")
    ceph.add_argument("--cephfs", action="store_true", help="export CephFS instead of DIR")
    ceph.add_argument("--ceph-conf", metavar="FILE", default=None, help="ceph.conf (default)")
    ceph.add_argument("--ceph-id", metavar="NAME", default=None, help="cephx client (admin)")
    ceph.add_argument("--ceph-path", metavar="PATH", default="/", help="CephFS directory (/)")
    ceph.add_argument(
        "--ceph-grace-pool",
        metavar="POOL",
        default="nfsrdma",
        help="RADOS pool of the grace period shared by every server of this CephFS (nfsrdma)",
    )
    ceph.add_argument(
        "--node-name",
        metavar="NAME",
        default=None,
        help="this server among those of one CephFS, stable across restarts (host:tcp-port)",
    )
    p.add_argument(
        "--exports",
        metavar="FILE",
        default=None,
        help="serve the exports of FILE (exports(5) format, client rules) under a pseudo-root "
        "instead of DIRECTORY; SIGHUP reads it again",
    )
    p.add_argument("--bind", metavar="ADDR", default=None, help="address to listen on (all)")
    p.add_argument("--tcp-port", type=int, default=NFS_TCP_PORT, metavar="PORT")
    p.add_argument(
        "--rdma-port", type=int, default=NFS_RDMA_PORT, metavar="PORT", help="RPC-over-RDMA port"
    )
    p.add_argument("--rdma-device", default=None, metavar="DEV", help="RDMA device (any)")
    p.add_argument("--no-rdma", action="store_true", help="do not listen for RPC-over-RDMA")
    p.add_argument(
        "--rtrext",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="offer the rtrext extension (message continuation) to nfsrdma clients; Linux "
        "clients never take it (default: on)",
    )
    p.add_argument(
        "--rtrext-tbsn",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --rtrext, accept WRITE data by send-based placement (TBSN) from nfsrdma "
        "clients that ask for it (default: off)",
    )
    p.add_argument("--read-only", action="store_true", help="refuse every modification")
    p.add_argument("--no-root-squash", dest="root_squash", action="store_false", help="trust uid 0")
    p.add_argument("--anon-uid", type=int, default=65534, metavar="N")
    p.add_argument("--anon-gid", type=int, default=65534, metavar="N")
    p.add_argument("--lease-time", type=int, default=90, metavar="S", help="lease seconds")
    p.add_argument(
        "--grace-time",
        type=int,
        default=None,
        metavar="S",
        help="grace period after a restart, for clients to reclaim (default: the lease time)",
    )
    p.add_argument("--slots", type=int, default=64, metavar="N", help="slots per session")
    p.add_argument(
        "--no-delegations",
        dest="delegations",
        action="store_false",
        help="grant no read or write delegations (clients cannot cache opens)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where the file-handle key and the client records are kept (default: "
        "/var/lib/nfsrdma as root, else $XDG_STATE_HOME/nfsrdma or ~/.local/state/nfsrdma)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive,
        default=None,
        metavar="N",
        help="connections admitted in all (default: from the descriptor limit)",
    )
    p.add_argument(
        "--max-connections-per-source",
        type=_positive,
        default=None,
        metavar="N",
        help="connections admitted from one address (default: a quarter of all, at least 16)",
    )
    p.add_argument(
        "--max-open-files",
        type=_positive,
        default=None,
        metavar="N",
        help="files held open for clients, all together (default: from the descriptor limit)",
    )
    p.add_argument(
        "--max-state-per-client",
        type=_positive,
        default=None,
        metavar="N",
        help="opens and lock stateids of one client (default: a quarter of --max-open-files)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="close a connection without session or call after S idle seconds (0: never)",
    )
    p.add_argument(
        "--record-timeout",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="... or when its first record, or one begun, is not complete in S seconds (0: never)",
    )
    p.add_argument(
        "--stop-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="on SIGTERM, wait up to S seconds for the calls in progress to be answered",
    )
    p.add_argument(
        "--metrics",
        type=_address,
        default=None,
        metavar="ADDR:PORT",
        help="serve Prometheus metrics on http://ADDR:PORT/metrics (needs prometheus-client)",
    )
    p.add_argument(
        "--no-admin-socket",
        dest="admin_socket",
        action="store_false",
        help="do not listen on the admin socket STATE_DIR/admin.sock (nfsrdma stats)",
    )
    p.add_argument(
        "--sec",
        type=parse_sec,
        default=("sys",),
        metavar="LIST",
        help="security flavours in order of preference: sys, krb5, krb5i, krb5p (default: sys)",
    )
    p.add_argument(
        "--keytab", default=DEFAULT_KEYTAB, metavar="FILE", help="keytab with nfs/<host> (krb5*)"
    )
    p.add_argument(
        "--gss-host", default=None, metavar="HOST", help="host of nfs/HOST (default: FQDN)"
    )
    p.set_defaults(func=serve)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    s = float(text)
    if not s >= 0:
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return s


def _listening(server: NFSServer) -> str:
    """Where the server listens, for the service manager's STATUS line."""
    rdma = f"rdma port {server.rdma.port}" if server.rdma is not None else "rdma off"
    return f"serving: tcp {server.bind or '*'} port {server.tcp_port}, {rdma}"


def config_of(args: argparse.Namespace) -> ServerConfig:
    """The service limits and policies the command line asks for (the defaults follow the
    descriptor limit in force: ``serve`` raises it to the hard limit first)."""
    cfg = ServerConfig(
        idle_timeout=args.idle_timeout,
        record_timeout=args.record_timeout,
        delegations=args.delegations,
    )
    if args.max_connections is not None:
        cfg = replace(cfg, max_connections=args.max_connections)
    if args.max_connections_per_source is not None:
        cfg = replace(cfg, max_connections_per_source=args.max_connections_per_source)
    if args.max_open_files is not None:
        cfg = replace(cfg, max_open_files=args.max_open_files)
    if args.max_state_per_client is not None:
        cfg = replace(cfg, max_state_per_client=args.max_state_per_client)
    return cfg


def backend_of(args: argparse.Namespace) -> Callable[[Export], Vfs] | None:
    """The Vfs factory ``--cephfs`` asks for (None: the local directory)."""
    if not args.cephfs:
        return None
    from nfsrdma.vfs.ceph.vfs import CephVfs

    return functools.partial(
        CephVfs,
        conf=args.ceph_conf,
        client_id=args.ceph_id,
        ceph_path=args.ceph_path,
        grace_pool=args.ceph_grace_pool,
    )


def security_of(args: argparse.Namespace, table: ExportTable | None) -> dict[str, Any]:
    """NFSServer's security keywords, the Kerberos acceptor made (and checked) here: from
    ``--sec`` for a DIRECTORY; for an exports file, when a rule's ``sec=`` names Kerberos."""
    if table is None:
        flavors, gss = security_setup(args.sec, args.keytab, args.gss_host)
        return {"sec": args.sec, "gss": gss} if flavors is not None else {}
    if args.sec != ("sys",):
        raise SecuritySetupError("--sec is for a DIRECTORY; an exports file says sec= per rule")
    kerberos = {KRB5, KRB5I, KRB5P}
    if not any(
        kerberos & set(rule.options.flavors) for entry in table.entries for rule in entry.rules
    ):
        return {}
    _, gss = security_setup(("krb5",), args.keytab, args.gss_host)
    return {"gss": gss}


def serve(args: argparse.Namespace) -> int:
    table = None
    if (args.exports is not None or args.cephfs) and args.directory is not None:
        log.error("give a DIRECTORY, --exports FILE or --cephfs, not two of them")
        return 2
    if args.exports is not None:
        if args.cephfs:
            log.error("--cephfs serves one CephFS directory; it does not combine with --exports")
            return 2
        try:
            table = load_exports(args.exports)
            check_paths(table, args.exports)
        except (ExportsError, OSError) as e:
            log.error("%s", e)
            return 2
    elif args.cephfs:
        args.directory = f"cephfs:{args.ceph_path}"
    elif args.directory is None:
        log.error("give the DIRECTORY to export, --exports FILE or --cephfs")
        return 2
    elif not os.path.isdir(args.directory):
        log.error("%s is not a directory", args.directory)
        return 2
    try:
        security = security_of(args, table)
    except SecuritySetupError as e:
        log.error("%s", e)
        return 2
    root = logging.getLogger("nfsrdma")
    root.setLevel(min(logging.INFO, root.getEffectiveLevel()))  # one line per connection/session
    raise_descriptor_limit()  # before the defaults of config_of follow it
    server = NFSServer(
        args.directory or "/",
        bind=args.bind,
        tcp_port=args.tcp_port,
        rdma_port=None if args.no_rdma else args.rdma_port,
        rdma_device=args.rdma_device,
        rdma_options=RdmaOptions(rtrext=args.rtrext, rtrext_tbsn=args.rtrext_tbsn),
        read_only=args.read_only,
        root_squash=args.root_squash,
        anon_uid=args.anon_uid,
        anon_gid=args.anon_gid,
        state_dir=args.state_dir,
        lease_time=args.lease_time,
        grace_time=args.grace_time,
        slots=args.slots,
        config=config_of(args),
        backend=backend_of(args),
        node_name=args.node_name,
        exports=table,
        exports_file=args.exports,
        admin_socket=args.admin_socket,
        metrics=args.metrics,
        **security,
    )

    async def main() -> None:
        try:
            await server.start()
        except StateDirError as e:
            log.error(
                "cannot use the state directory %s (%s); choose a writable one with --state-dir",
                e.state_dir,
                e.reason,
            )
            raise SystemExit(1) from None
        except OSError as e:
            log.error("cannot start: %s", e)
            raise SystemExit(1) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        sdnotify.notify("READY=1", "STATUS=" + _listening(server), f"MAINPID={os.getpid()}")
        if table is not None:
            loop.add_signal_handler(signal.SIGHUP, server.reload_exports)
        else:  # systemctl reload: nothing to read again, and no reason to stop
            loop.add_signal_handler(signal.SIGHUP, log.info, "SIGHUP: no exports file to reload")
        await stop.wait()
        log.info("stopping")
        sdnotify.notify("STOPPING=1", "STATUS=stopping: answering the calls in progress")
        await server.close(drain=args.stop_timeout)

    with contextlib.suppress(KeyboardInterrupt):
        run(main())
    return 0
