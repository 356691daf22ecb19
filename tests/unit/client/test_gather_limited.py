"""``gather_limited``: the client's helper for many calls with a bound on those in flight (plain
``stat`` of many files with 32 in flight, ``stat_many``, fsspec's batch operations)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from nfsrdma.client.fs import gather_limited


async def test_results_in_order_at_most_limit_at_once_and_no_task_per_awaitable() -> None:
    running = peak = tasks = 0
    gate = asyncio.Event()
    before = len(asyncio.all_tasks())  # this test's own (and the runner's)

    async def one(i: int) -> int:
        nonlocal running, peak, tasks
        running += 1
        peak = max(peak, running)
        tasks = max(tasks, len(asyncio.all_tasks()))
        if running == 4:
            gate.set()
        await gate.wait()
        await asyncio.sleep(0)
        running -= 1
        return i * i

    got = await asyncio.wait_for(gather_limited([one(i) for i in range(100)], 4), 10)
    assert got == [i * i for i in range(100)]
    assert peak == 4
    # wait_for's task for gather_limited and the 4 that take the awaitables in turn: not one
    # task per awaitable.
    assert tasks == before + 1 + 4
    assert await gather_limited([], 8) == []


async def test_first_error_is_raised_and_the_rest_still_run() -> None:
    done: list[int] = []
    release = asyncio.Event()

    async def one(i: int) -> int:
        if i == 3:
            raise OSError(5, "boom")
        if i > 3:
            await release.wait()
        done.append(i)
        return i

    with pytest.raises(OSError, match="boom"):
        await asyncio.wait_for(gather_limited([one(i) for i in range(10)], 2), 10)
    release.set()
    for _ in range(50):  # the other worker goes on with the rest, as asyncio.gather would
        if len(done) == 9:
            break
        await asyncio.sleep(0)
    assert sorted(done) == [i for i in range(10) if i != 3]


async def test_cancelled_closes_what_it_had_not_started() -> None:
    started: list[int] = []
    never = asyncio.Event()

    async def one(i: int) -> None:
        started.append(i)
        await never.wait()

    coros = [one(i) for i in range(10)]
    task = asyncio.ensure_future(gather_limited(coros, 3))
    while len(started) < 3:
        await asyncio.sleep(0)
    task.cancel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be raised
        with pytest.raises(asyncio.CancelledError):
            await task
        gc.collect()
    assert started == [0, 1, 2]
    assert all(c.cr_frame is None for c in coros)  # each one finished or closed
