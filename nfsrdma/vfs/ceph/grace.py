"""A grace period shared by every nfsrdma server in front of one CephFS, kept in RADOS.

When one server restarts, its clients reclaim their opens and locks from it; meanwhile no
server may hand out state that could conflict with what they will reclaim, so every server
refuses non-reclaim OPENs and LOCKs (NFS4ERR_GRACE) until the restarted one's clients are done.

The shared record is one RADOS object, ``grace-<fscid>`` in pool ``--ceph-grace-pool``
(created when missing), whose omap holds one key per server that needs a grace period:
``need:<node>`` = the wall-clock time (seconds) at which that need lapses by itself. A server
starting with client records writes its key (``begin``); it removes it (``end``) when its own
grace period is over: every client of its previous instance reclaimed, or its grace time ran
out. Each server touches only its own key, so no lock is needed. The cluster is in grace while
any key has not lapsed; a server that dies in its grace period stops holding the others after
the lapse time (twice its grace time). Every server reads the keys once a ``poll`` interval
in a thread of its own (RADOS calls block while the cluster is unreachable), so a server sees
another's grace begin or end within that interval. The same thread removes this server's key
when ``end`` is called: ``end`` runs on the server's event loop (from the grace core) and must
not wait for RADOS.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Final

log = logging.getLogger("nfsrdma.grace")

_PREFIX: Final = "need:"


class ClusterGrace:
    def __init__(
        self,
        conf: str | None,
        client_id: str | None,
        pool: str,
        fscid: int,
        node: str,
        poll: float = 1.0,
    ) -> None:
        import rados  # Debian's python3-rados

        self._rados: Any = rados
        self.cluster = rados.Rados(conffile=conf or "", rados_id=client_id or "admin")
        self.cluster.connect(timeout=30)
        if not self.cluster.pool_exists(pool):
            self.cluster.create_pool(pool)
        self.ioctx = self.cluster.open_ioctx(pool)
        self.obj = f"grace-{fscid}"
        self.key = _PREFIX + node
        self.node = node
        self._others_in_grace = False
        self._stop = False
        self._ending = False  # end() was called; the poller removes our key
        self._wake = threading.Event()
        self._refreshed = threading.Event()
        self.refresh()
        self._thread = threading.Thread(
            target=self._poll, args=(poll,), name="nfsrdma-cluster-grace", daemon=True
        )
        self._thread.start()

    def _needs(self) -> dict[str, float]:
        with self._rados.ReadOpCtx() as op:
            it, _ = self.ioctx.get_omap_vals(op, "", _PREFIX, 1024)
            try:
                self.ioctx.operate_read_op(op, self.obj)
            except self._rados.ObjectNotFound:
                return {}
            out = {}
            for k, v in it:
                try:
                    out[k] = float(v.decode())
                except ValueError:
                    continue
            return out

    def refresh(self) -> None:
        """Read the shared record now (the poller does this every interval)."""
        now = time.time()
        others = {k: t for k, t in self._needs().items() if k != self.key and t > now}
        if bool(others) != self._others_in_grace:
            log.info(
                "cluster grace %s%s",
                "begins: servers " if others else "over",
                ", ".join(k.removeprefix(_PREFIX) for k in others) if others else "",
            )
        self._others_in_grace = bool(others)
        self._refreshed.set()

    def _poll(self, interval: float) -> None:
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            try:
                if self._ending:
                    self._remove_key()
                    self._ending = False
                if self._stop:
                    return
                self.refresh()
            except Exception as e:  # the cluster unreachable: keep the last answer, retry
                log.warning("cluster grace: cannot reach %s: %s", self.obj, e)
                if self._stop:
                    return

    # ------------------------------------------------------------------ SharedGrace
    def begin(self, seconds: float) -> None:
        """This server needs a grace period (it restarted with clients to reclaim)."""
        lapse = time.time() + max(2 * seconds, 10.0)
        with self._rados.WriteOpCtx() as op:
            op.new(self._rados.LIBRADOS_CREATE_IDEMPOTENT)
            self.ioctx.set_omap(op, (self.key,), (str(lapse).encode(),))
            self.ioctx.operate_write_op(op, self.obj)
        log.info(
            "cluster grace: %s needs one (lapses in %.0fs at most)", self.node, lapse - time.time()
        )

    def end(self) -> None:
        """This server's grace period is over: the poller removes its key (at once)."""
        self._ending = True
        self._wake.set()

    def _remove_key(self) -> None:
        with self._rados.WriteOpCtx() as op:
            self.ioctx.remove_omap_keys(op, (self.key,))
            with contextlib.suppress(self._rados.ObjectNotFound):
                self.ioctx.operate_write_op(op, self.obj)

    def in_grace(self) -> bool:
        """Another server is in its grace period (as last read)."""
        return self._others_in_grace

    def close(self) -> None:
        """Stop polling (a pending ``end`` is written first, if RADOS answers in time)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.ioctx.close()
        self.cluster.shutdown()
