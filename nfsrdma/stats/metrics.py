"""Prometheus exposition of a server's figures (``nfsrdma serve --metrics ADDR:PORT``).

A custom collector turns one snapshot (``collect``) into metric families at scrape time, so
nothing is updated per request; a small HTTP endpoint on the server's event loop answers
``GET /metrics`` (the snapshot is taken on the loop, never from another thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

Snapshot = Callable[[], dict[str, Any]]

# RPC-over-RDMA counters with a family of their own: key -> (family, label values).
_MESSAGES = {
    "calls_inline": ("call", "inline"),
    "calls_long": ("call", "long"),
    "replies_inline": ("reply", "inline"),
    "replies_long": ("reply", "long"),
}
_CHUNKS = {
    "read_chunks_received": ("read", "received"),
    "write_chunks_offered": ("write", "offered"),
    "write_chunks_filled": ("write", "filled"),
    "reply_chunks_offered": ("reply", "offered"),
}
_ERRORS = {"rdma_error_vers_sent": "ERR_VERS", "rdma_error_chunk_sent": "ERR_CHUNK"}
_SESSIONS = {
    "clients": "nfsrdma_clients",
    "sessions": "nfsrdma_sessions",
    "slots": "nfsrdma_session_slots",
    "slots_in_use": "nfsrdma_session_slots_in_use",
    "reply_cache_bytes": "nfsrdma_reply_cache_bytes",
    "reply_cache_reserved_bytes": "nfsrdma_reply_cache_reserved_bytes",
}


class ServerCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self.snapshot())


def families(snap: dict[str, Any]) -> Iterator[Metric]:
    """The metric families of one snapshot taken with bucket counts."""
    yield GaugeMetricFamily(
        "nfsrdma_uptime_seconds", "Seconds since the server started", value=snap["uptime_s"]
    )
    ops = CounterMetricFamily(
        "nfsrdma_operations", "NFSv4.1 operations done", labels=["transport", "op"]
    )
    errors = CounterMetricFamily(
        "nfsrdma_operation_errors",
        "NFSv4.1 operations that failed, by status",
        labels=["transport", "op", "status"],
    )
    latency = HistogramMetricFamily(
        "nfsrdma_operation_latency_seconds",
        "Time from the previous operation's end (or the COMPOUND's start) to this one's",
        labels=["transport", "op"],
    )
    compounds = CounterMetricFamily("nfsrdma_compounds", "COMPOUNDs received", labels=["transport"])
    replays = CounterMetricFamily(
        "nfsrdma_compound_replays", "COMPOUNDs answered from the reply cache", labels=["transport"]
    )
    conns = GaugeMetricFamily("nfsrdma_connections", "Open connections", labels=["transport"])
    les = [repr(float(b)) for b in snap["bounds_s"]] + ["+Inf"]
    for kind, t in snap["transports"].items():
        compounds.add_metric([kind], t["compounds"])
        replays.add_metric([kind], t["replays"])
        conns.add_metric([kind], t["connections"])
        for name, op in t["ops"].items():
            ops.add_metric([kind, name], op["count"])
            for status, n in op["errors"].items():
                errors.add_metric([kind, name, status], n)
            cumulative, total = [], 0
            for le, n in zip(les, op["buckets"], strict=True):
                total += n
                cumulative.append((le, float(total)))
            latency.add_metric([kind, name], cumulative, op["seconds"])
    yield from (ops, errors, latency, compounds, replays, conns)

    rdma = snap["rdma"]
    counters: dict[str, int] = rdma["counters"]
    yield GaugeMetricFamily(
        "nfsrdma_rdma_credits_granted",
        "RPC-over-RDMA credits granted on the open connections",
        value=rdma["credits_granted"],
    )
    messages = CounterMetricFamily(
        "nfsrdma_rdma_messages",
        "RPC-over-RDMA calls received and replies sent: inline, or long (position-zero Read "
        "chunk / Reply chunk)",
        labels=["direction", "placement"],
    )
    for key, labels in _MESSAGES.items():
        messages.add_metric(list(labels), counters.get(key, 0))
    chunks = CounterMetricFamily(
        "nfsrdma_rdma_chunks",
        "Chunks in RPC-over-RDMA calls: Read chunks received, Write and Reply chunks offered, "
        "Write chunks filled by replies",
        labels=["chunk", "use"],
    )
    for key, labels in _CHUNKS.items():
        chunks.add_metric(list(labels), counters.get(key, 0))
    rdma_errors = CounterMetricFamily(
        "nfsrdma_rdma_errors_sent", "RDMA_ERROR messages sent, by kind", labels=["kind"]
    )
    for key, kind in _ERRORS.items():
        rdma_errors.add_metric([kind], counters.get(key, 0))
    events = CounterMetricFamily(
        "nfsrdma_rdma_events",
        "Other RPC-over-RDMA counters (sends, RDMA Reads and Writes, registrations, ...)",
        labels=["event"],
    )
    named = {*_MESSAGES, *_CHUNKS, *_ERRORS}
    for key, n in counters.items():
        if key not in named:
            events.add_metric([key], n)
    yield from (messages, chunks, rdma_errors, events)

    for key, name in _SESSIONS.items():
        if key in snap["sessions"]:
            yield GaugeMetricFamily(name, f"Session figure: {key}", value=snap["sessions"][key])


class MetricsEndpoint:
    """``GET /metrics`` over HTTP/1.0 on ``host:port``, answered on the event loop."""

    def __init__(self, host: str, port: int, snapshot: Snapshot) -> None:
        self.host = host
        self.requested_port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(snapshot))
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host or None, self.requested_port, limit=16 * 1024
        )
        log.info("metrics on http://%s:%d/metrics", self.host or "*", self.port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, _, rest = head.partition(b" ")
            path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path not in (b"/metrics", b"/"):
                status, ctype, body = "404 Not Found", "text/plain", b"see /metrics\n"
            else:
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            if method != b"HEAD":
                writer.write(body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
