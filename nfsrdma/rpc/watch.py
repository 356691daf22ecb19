"""The event-loop side of ``idle``: a timer per connection that asks the tracker for a verdict
and closes the connection when told to. The loop's clock is read here and nowhere else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.rpc.idle import IdleTimeouts, IdleTracker


class IdleWatch:
    def __init__(
        self,
        rpc: RpcConnection,
        timeouts: IdleTimeouts,
        *,
        has_session: Callable[[RpcConnection], bool],
        expired: Callable[[RpcConnection, str], None],
    ) -> None:
        """``expired(rpc, why)`` runs when the connection should be closed (it closes it)."""
        self.rpc = rpc
        self.has_session = has_session
        self.expired = expired
        self.reason: str | None = None  # why the watch had the connection closed
        self._loop = asyncio.get_running_loop()
        self.tracker = IdleTracker(timeouts, self._now())
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(
            self.tracker.first_check(), self._check
        )

    def _now(self) -> float:
        return self._loop.time()

    def _check(self) -> None:
        self._timer = None
        rpc = self.rpc
        conn = rpc.conn
        if conn.closed:
            return
        verdict = self.tracker.check(
            self._now(),
            messages=conn.messages_received,
            receiving=conn.receiving,
            busy=rpc.busy,
            has_session=self.has_session(rpc),
        )
        if verdict.close is not None:
            self.reason = verdict.close
            self.expired(rpc, verdict.close)
        else:
            self._timer = self._loop.call_at(verdict.check_at, self._check)

    def stop(self) -> None:
        """The connection has closed: no more checks (and no reference to it from the loop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
