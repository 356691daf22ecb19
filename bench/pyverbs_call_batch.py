"""What holding our calls of one loop turn for one post costs the pyverbs path in Python, on
the host (no RDMA device; pyverbs is needed).

A ``PyverbsQueuePair`` without a device (its verbs objects replaced where the send path reaches
them: ``QP.post_send`` is a counter), ``--calls`` Sends of one turn, the way the requester
posts a call's Send (one scatter element, signalled or not):

- ``alone``: each Send is its own ``post_send`` (one ``ibv_post_send``, one doorbell, each);
- ``held``: ``hold_sends`` first, then the Sends, then the ring: one list, one post.

The verbs call itself (``ibv_post_send``: on rxe a system call per post, the doorbell) is left
out, so the figures are the Python around it; what the doorbells saved cost is measured in the
test bed (``client.py``). Printed: µs per Send both ways (median and range of ``--rounds``,
interleaved) and posts per turn; the last line is ``alone_us=… held_us=… posts_alone=…
posts_held=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nfsrdma.transport.rdma.provider import Sge
from nfsrdma.transport.rdma.pyverbs_qp import PyverbsQueuePair
from nfsrdma.transport.rdma.pyverbs_wr import ReusedWrs


class CountingQp:
    def __init__(self) -> None:
        self.posts = 0

    def post_send(self, first: object) -> None:
        self.posts += 1


def queue_pair(loop: asyncio.AbstractEventLoop) -> tuple[PyverbsQueuePair, CountingQp]:
    qp = PyverbsQueuePair.__new__(PyverbsQueuePair)
    verbs = CountingQp()
    fields = {
        "_device": SimpleNamespace(caps=SimpleNamespace(remote_invalidate=True)),
        "_config": SimpleNamespace(max_inline_data=0),
        "_loop": loop,
        "_on_event": lambda ev: None,
        "_outstanding": {},
        "_sq_order": collections.deque(),
        "counts": collections.Counter(),
        "_state": "rts",
        "_closed": False,
        "_wrs": ReusedWrs(),
        "_held": None,
        "_poster": None,
        "_qp": verbs,
    }
    for k, v in fields.items():
        object.__setattr__(qp, k, v)
    return qp, verbs


def turn(qp: PyverbsQueuePair, calls: int, base: int, held: bool) -> None:
    if held:
        qp.hold_sends()
    for i in range(calls):
        qp.post_send(base + i, [Sge(0x10000 + 4096 * i, 120 + i, 7)], signaled=i == calls - 1)
    if held:
        qp._ring_held()  # what the loop's call_soon runs at the end of the turn
    for i in range(calls):  # the completions' bookkeeping: free the ids for the next turn
        qp._outstanding.pop(base + i, None)
    qp._sq_order.clear()


def measure(calls: int, turns: int, held: bool) -> tuple[float, float]:
    loop = asyncio.new_event_loop()
    try:
        qp, verbs = queue_pair(loop)
        turn(qp, calls, 0, held)  # warm: the reusable objects exist
        verbs.posts = 0
        start = time.perf_counter()
        for t in range(turns):
            turn(qp, calls, (t + 1) * calls, held)
        elapsed = time.perf_counter() - start
        loop.run_until_complete(asyncio.sleep(0))  # the scheduled rings find nothing held
        return elapsed / (turns * calls) * 1e6, verbs.posts / turns
    finally:
        loop.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=32, help="Sends per loop turn")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    got: dict[bool, list[float]] = {False: [], True: []}
    posts: dict[bool, float] = {}
    for _ in range(args.rounds):
        for held in (False, True):
            us, posts[held] = measure(args.calls, args.turns, held)
            got[held].append(us)
    print(f"{args.calls} Sends per turn, {args.turns} turns, {args.rounds} rounds interleaved")
    for held in (False, True):
        us = got[held]
        name = "held" if held else "alone"
        print(
            f"{name:6} {statistics.median(us):6.2f} us/Send ({min(us):.2f}-{max(us):.2f}), "
            f"{posts[held]:.0f} posts/turn"
        )
    print(
        f"alone_us={statistics.median(got[False]):.2f} held_us={statistics.median(got[True]):.2f}"
        f" posts_alone={posts[False]:.0f} posts_held={posts[True]:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
