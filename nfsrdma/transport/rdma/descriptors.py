"""Finding the descriptor of a verbs channel that pyverbs 44 does not expose.

pyverbs' ``CompChannel`` hides its ``ibv_comp_channel.fd``; the provider needs it for
``loop.add_reader``. This is the one place that finds a descriptor by comparing
``/proc/self/fd`` before and after creating the channel (the rdma_cm event channel's comes from
librdmacm directly, see ``rdmacm``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from typing import TypeVar

from nfsrdma.transport.rdma.provider import ProviderError

_T = TypeVar("_T")


def _fd_targets() -> dict[int, str]:
    targets: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return targets


def create_with_descriptor(factory: Callable[[], _T], kind: str) -> tuple[_T, int]:
    """Create a channel and find the one new descriptor whose target contains ``kind``; make it
    non-blocking so a spurious read fails with EAGAIN instead of freezing the loop."""
    before = {fd for fd, target in _fd_targets().items() if kind in target}
    obj = factory()
    new = [fd for fd, target in _fd_targets().items() if kind in target and fd not in before]
    if len(new) != 1:
        raise ProviderError(f"cannot identify the descriptor of a new {kind} channel: {new}")
    fd = new[0]
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    return obj, fd
