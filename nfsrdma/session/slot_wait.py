"""Waiting for a requester slot under asyncio: the table says when one may be free (sans-IO,
``RequesterSlots.add_waiter``); this turns that signal into something to await. No polling."""

from __future__ import annotations

import asyncio

from nfsrdma.session.requester_slots import RequesterSlots


async def slot_signal(table: RequesterSlots) -> None:
    """Return when ``table`` signals that a slot may have come free (the caller acquires
    again; it may lose the race and wait again). A waiter that is cancelled after being woken
    passes the wake-up on, so no free slot is left with a requester waiting for it."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    table.add_waiter(wake)
    try:
        await fut
    except BaseException:
        if not table.remove_waiter(wake):
            table.wake_one()
        raise
