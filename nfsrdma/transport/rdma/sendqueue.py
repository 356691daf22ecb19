"""Send queue accounting with selective signalling (sans-IO).

A work request posted without ``IBV_SEND_SIGNALED`` produces no completion when it succeeds;
its send queue slot, and whatever local memory it reads, are free only once a later signalled
work request of the same send queue completes (an RC send queue completes in posting order).
This module keeps the posting order and decides which chains to signal so that:

- the send queue never overflows: a chain is posted only when ``used + len(chain) <= depth``,
  counting every work request not yet covered by a completion;
- nobody waits forever: whenever the queue is more than half full, or the caller says a
  resource is scarce (``pressure``: few send buffers left, someone waiting), the chain just
  posted is signalled, so a completion that frees room and buffers is always on its way;
- at most ``signal_every`` chains in a row go unsignalled (completions are cheap to skip, not
  to starve: buffers come back in batches of at most that many).

An error completion (every flushed work request reports one, signalled or not) covers the work
requests posted before it, as a success does.
"""

from __future__ import annotations

from collections import deque

__all__ = ["SendQueue"]


class SendQueue:
    """Posting order, room and signalling decisions for one send queue of ``depth`` slots."""

    def __init__(self, depth: int, signal_every: int = 8) -> None:
        if depth < 2:
            raise ValueError("a send queue with selective signalling needs at least 2 slots")
        self.depth = depth
        self.signal_every = max(1, signal_every)
        self._posted: deque[int] = deque()  # wr_ids not yet covered, in posting order
        self._signaled: set[int] = set()
        self._unsignaled_run = 0  # chains posted unsignalled since the last signalled one

    @property
    def used(self) -> int:
        return len(self._posted)

    def room(self, count: int) -> bool:
        """Can a chain of ``count`` work requests be posted now?"""
        return len(self._posted) + count <= self.depth

    def should_signal(self, count: int, *, pressure: bool = False) -> bool:
        """Whether a chain of ``count`` work requests (its last one) is to be signalled."""
        return (
            pressure
            or self._unsignaled_run + 1 >= self.signal_every
            or 2 * (len(self._posted) + count) > self.depth
        )

    def posted(self, wr_ids: list[int], signaled: bool) -> None:
        """A chain went out; only its last work request is signalled (if ``signaled``)."""
        if len(self._posted) + len(wr_ids) > self.depth:
            raise OverflowError(f"send queue of {self.depth} would overflow")
        self._posted.extend(wr_ids)
        if signaled:
            self._signaled.add(wr_ids[-1])
            self._unsignaled_run = 0
        else:
            self._unsignaled_run += 1

    def signaled(self, wr_id: int) -> bool:
        return wr_id in self._signaled

    def completed(self, wr_id: int) -> list[int]:
        """A completion of ``wr_id`` (success or error): the work requests posted before it
        that are covered now and had no completion of their own, in order. ``wr_id`` itself
        is retired too. An id that is not (or no longer) queued covers nothing."""
        if wr_id not in self._signaled and wr_id not in self._posted:
            return []
        self._signaled.discard(wr_id)
        covered: list[int] = []
        posted = self._posted
        while posted:
            first = posted.popleft()
            if first == wr_id:
                return covered
            self._signaled.discard(first)
            covered.append(first)
        return covered

    def clear(self) -> list[int]:
        """Everything still queued (the connection is gone), in posting order."""
        left = list(self._posted)
        self._posted.clear()
        self._signaled.clear()
        self._unsignaled_run = 0
        return left
