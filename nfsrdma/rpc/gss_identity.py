"""Who an RPCSEC_GSS principal is on this machine (the identity the VFS then runs with).

- ``user@REALM`` (one component): the local user ``user`` through the name service (passwd and
  group, as rpc.idmapd's nsswitch method does), with its supplementary groups; a name that is a
  number and not a user is that uid (and gid), as idmapd's numeric fallback does.
- machine and service principals (``host/...``, ``nfs/...``, any name with an instance):
  the anonymous identity, unless a uid/gid is configured for them (``machine``).
- a user the name service does not know: the anonymous identity.

The realm is not compared with a local one: the keytab's KDC authenticated the principal, and
cross-realm trust is the KDC's decision.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

Identity = tuple[int, int, tuple[int, ...]]  # uid, gid, supplementary gids


@dataclass(frozen=True, slots=True)
class IdentityMap:
    machine: tuple[int, int] | None = None  # uid, gid for machine principals (None: anonymous)

    def identity(self, principal: str) -> Identity | None:
        """The principal's uid, gid and groups; None for the anonymous identity."""
        name, _, _realm = principal.rpartition("@")
        if not name:
            name = principal
        if "/" in name:
            if self.machine is None:
                return None
            return self.machine[0], self.machine[1], ()
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            if name.isdigit() and int(name) < 1 << 32:
                return int(name), int(name), ()
            return None
        try:
            groups = os.getgrouplist(name, pw.pw_gid)
        except OSError:
            groups = [g.gr_gid for g in grp.getgrall() if name in g.gr_mem]
        gids = tuple(g for g in groups if g != pw.pw_gid)[:16]
        return pw.pw_uid, pw.pw_gid, gids
