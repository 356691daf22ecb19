"""The service manager's readiness protocol (sd_notify(3)), without libsystemd.

When systemd starts a ``Type=notify`` service it puts the path of a datagram socket in
``NOTIFY_SOCKET``: a file-system path, or ``@name`` for a socket in the abstract namespace.
The service sends newline-separated ``KEY=VALUE`` assignments to it, one datagram per
notification: ``READY=1`` once it serves, ``STOPPING=1`` when it begins to stop, ``STATUS=...``
a line ``systemctl status`` shows. Without ``NOTIFY_SOCKET`` (not started by systemd) nothing is
sent. A failure to send is logged and otherwise ignored: the server serves all the same.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("nfsrdma.server")


def notify_address(env: Mapping[str, str] | None = None) -> str | None:
    """The socket address ``NOTIFY_SOCKET`` names (abstract ones start with a NUL), or None
    when it is unset or names something other than an AF_UNIX socket (vsock: not supported)."""
    value = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(*assignments: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``assignments`` (``"READY=1"``, ``"STATUS=..."``) as one notification; True when
    it was sent. Values must not contain newlines (they separate the assignments)."""
    address = notify_address(env)
    if address is None:
        return False
    for a in assignments:
        if "=" not in a or "\n" in a:
            raise ValueError(f"not a KEY=VALUE line: {a!r}")
    message = "\n".join(assignments).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.send(message)
    except OSError as e:
        log.warning("cannot notify the service manager at %s: %s", address.lstrip("\0"), e)
        return False
    return True
