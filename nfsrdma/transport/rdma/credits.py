"""RPC-over-RDMA credits (RFC 8166 section 3.3.1; TR-14, TR-15, UL-24, UL-26), sans-IO.

The requester may have at most as many calls outstanding as the responder last granted; before
the first reply the grant is 1, a grant of 0 counts as 1, and grants are clamped to what the
requester itself provisioned. One credit is kept back for an idle-connection probe, so a client
that has used every other credit can still find out whether the server is alive. Slots (NFS)
and credits (transport) are separate limits: a call needs both.
"""

from __future__ import annotations

from dataclasses import dataclass

from nfsrdma._mypyc import mypyc_attr


@mypyc_attr(allow_interpreted_subclasses=True)  # tests watch it through a subclass
@dataclass(slots=True)
class CreditWindow:
    """The requester's view of its credits."""

    local_max: int  # receives we can post for replies
    granted: int = 1
    in_flight: int = 0

    def update(self, grant: int) -> None:
        """A reply's rdma_credit (TR-14)."""
        self.granted = max(1, min(grant, self.local_max))

    def limit(self, probe: bool = False) -> int:
        """How many calls may be outstanding: all the credits for a probe, one less otherwise
        (UL-26), and never fewer than one."""
        if probe or self.granted <= 1:
            return self.granted
        return self.granted - 1

    def may_send(self, probe: bool = False) -> bool:
        return self.in_flight < self.limit(probe)

    def free(self) -> int:
        """Credits not in use (outside the one kept for a probe)."""
        return max(0, self.limit() - self.in_flight)

    def sent(self, n: int = 1) -> None:
        """A call holds ``n`` credits: one per transmission of it or of its reply (RT-8)."""
        self.in_flight += n

    def done(self, n: int = 1) -> None:
        self.in_flight = max(0, self.in_flight - n)


@dataclass(frozen=True, slots=True)
class CreditPolicy:
    """The responder's grant. It keeps at least ``grant + backchannel`` receives posted (TR-15)."""

    grant: int = 32
    backchannel: int = 2

    @property
    def receives(self) -> int:
        return self.grant + self.backchannel
