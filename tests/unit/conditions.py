"""Waiting for a condition by event, not by sleeping: the object under observation calls
``Changes.notify()`` whenever its state changes, and ``until(predicate)`` resumes exactly when
the predicate becomes true. The timeout is a guard against a hang, never the synchronisation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    """Waiters on predicates over some state, re-checked at every ``notify()``."""

    def __init__(self) -> None:
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def notify(self) -> None:
        for entry in list(self._waiters):
            predicate, fut = entry
            if not fut.done() and predicate():
                fut.set_result(None)

    async def until(
        self, predicate: Callable[[], bool], *, timeout: float = 10.0, what: str = "condition"
    ) -> None:
        """Return once ``predicate()`` holds (checked now and at every change); fail with an
        AssertionError naming ``what`` if it does not within ``timeout`` seconds."""
        if predicate():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (predicate, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise AssertionError(f"{what} not reached within {timeout:g} s") from None
        finally:
            self._waiters.remove(entry)


async def loop_turn() -> None:
    """Let every callback already queued on the event loop run (the loop runs them in FIFO
    order), then resume: e.g. an event a provider queued with ``call_soon`` has been delivered.
    A barrier in the loop's order, not a pause in time."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.call_soon(fut.set_result, None)
    await fut
