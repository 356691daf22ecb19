"""``nfsrdma stats``: a running server's figures, read over its admin socket, as an
nfsstat-like table (or ``--json``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nfsrdma.stats.admin import query, socket_path
from nfsrdma.vfs.secret import default_state_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stats", help="show a running server's statistics (admin socket)")
    p.add_argument(
        "--state-dir",
        default=None,
        help="the server's state directory, where admin.sock is (default: as nfsrdma serve's)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=stats_command)


def stats_command(args: argparse.Namespace) -> int:
    path = socket_path(args.state_dir or default_state_dir())
    try:
        snap = query(path)["stats"]
    except OSError as e:
        print(f"nfsrdma stats: {path}: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(snap, sys.stdout, indent=1)
        print()
    else:
        print("\n".join(table(snap)))
    return 0


def table(snap: dict[str, Any]) -> list[str]:
    """The figures as text: server and sessions, then per transport the operations (calls,
    errors, p50, p99), errors by status, and the RPC-over-RDMA counters."""
    s = snap.get("sessions", {})
    out = [
        f"Server: up {snap['uptime_s']:.0f} s; {s.get('clients', 0)} clients, "
        f"{s.get('sessions', 0)} sessions, {s.get('slots_in_use', 0)}/{s.get('slots', 0)} slots "
        f"in use, reply cache {s.get('reply_cache_bytes', 0)} bytes "
        f"({s.get('reply_cache_reserved_bytes', 0)} reserved)"
    ]
    for kind, t in snap["transports"].items():
        out.append("")
        out.append(
            f"{kind}: {t['connections']} connections, {t['compounds']} COMPOUNDs, "
            f"{t['replays']} replayed"
        )
        if not t["ops"]:
            continue
        out.append(f"  {'op':<22}{'calls':>10}{'errors':>8}{'p50 ms':>10}{'p99 ms':>10}")
        errors = []
        for name, op in sorted(t["ops"].items(), key=lambda kv: -kv[1]["count"]):
            nerr = sum(op["errors"].values())
            out.append(
                f"  {name:<22}{op['count']:>10}{nerr:>8}{op['p50_ms']:>10.3f}{op['p99_ms']:>10.3f}"
            )
            errors += [f"    {name} {status} {n}" for status, n in op["errors"].items()]
        if errors:
            out.append("  errors by status:")
            out += errors
    rdma = snap.get("rdma", {})
    c: dict[str, int] = rdma.get("counters", {})
    out += [
        "",
        f"RPC-over-RDMA: {rdma.get('connections', 0)} connections "
        f"({rdma.get('connections_closed', 0)} closed), "
        f"{rdma.get('credits_granted', 0)} credits granted",
        f"  calls   inline {c.get('calls_inline', 0)}  long {c.get('calls_long', 0)}",
        f"  replies inline {c.get('replies_inline', 0)}  long {c.get('replies_long', 0)}",
        f"  chunks  read {c.get('read_chunks_received', 0)}  "
        f"write {c.get('write_chunks_offered', 0)} offered / "
        f"{c.get('write_chunks_filled', 0)} filled  reply {c.get('reply_chunks_offered', 0)}",
        f"  RDMA_ERROR sent  ERR_VERS {c.get('rdma_error_vers_sent', 0)}  "
        f"ERR_CHUNK {c.get('rdma_error_chunk_sent', 0)}",
    ]
    shown = {
        "calls_inline", "calls_long", "replies_inline", "replies_long", "read_chunks_received",
        "write_chunks_offered", "write_chunks_filled", "reply_chunks_offered",
        "rdma_error_vers_sent", "rdma_error_chunk_sent",
    }  # fmt: skip
    rest = [f"{k} {v}" for k, v in c.items() if k not in shown]
    if rest:
        out.append("  " + ", ".join(rest))
    return out
