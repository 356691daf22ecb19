"""Client records and the EXCHANGE_ID case table (RFC 8881 section 18.35.5), sans-IO.

Per co_ownerid the server holds at most one confirmed and one unconfirmed record.
Without EXCHGID4_FLAG_UPD_CONFIRMED_REC_A:

1. new owner                         -> new unconfirmed record;
2. confirmed, same verifier+principal -> that record, unchanged (retry, or trunking probe);
3. confirmed, other principal        -> NFS4ERR_CLID_INUSE while the old client holds state
                                        under an unexpired lease; else the old record goes
                                        and this is case 1;
4. unconfirmed only                  -> it is replaced by a new unconfirmed record;
5. confirmed, same principal, other verifier (client restart) -> a new unconfirmed record;
   the confirmed one lives on until CREATE_SESSION confirms the new one (18.36.4).

With it:

6. confirmed, same verifier+principal -> update of that record;
7. no confirmed record               -> NFS4ERR_NOENT;
8. confirmed, other verifier         -> NFS4ERR_NOT_SAME;
9. confirmed, other principal        -> NFS4ERR_PERM.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

from nfsrdma.session.errors import SessionError
from nfsrdma.session.records import Client
from nfsrdma.session.shares import Tally
from nfsrdma.xdr.gen import nfs4


class ClientRegistry:
    def __init__(self, random_bytes: Callable[[int], bytes]) -> None:
        self.by_id: dict[int, Client] = {}
        self.confirmed: dict[bytes, Client] = {}  # by co_ownerid
        self.unconfirmed: dict[bytes, Client] = {}  # oldest first
        self.per_source: Tally[str] = Tally()  # records by source address
        # Client ids: a random boot tag above a counter, so that ids of an earlier server
        # instance are stale (NFS4ERR_STALE_CLIENTID) rather than someone else's.
        tag = int.from_bytes(random_bytes(4), "big")
        self._tag = (tag | 1) << 32
        self._counter = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def __iter__(self) -> Iterator[Client]:
        return iter(list(self.by_id.values()))

    def get(self, clientid: int) -> Client | None:
        return self.by_id.get(clientid)

    def _new_clientid(self) -> int:
        while True:
            self._counter = (self._counter + 1) & 0xFFFFFFFF
            clientid = self._tag | self._counter
            if self._counter and clientid not in self.by_id:
                return clientid

    def create(
        self, owner: bytes, verifier: bytes, principal: Hashable, now: float, source: str = ""
    ) -> Client:
        client = Client(self._new_clientid(), owner, verifier, principal, now, now, source=source)
        self.by_id[client.clientid] = client
        self.unconfirmed[owner] = client
        self.per_source.add(source, 1)
        return client

    def remove(self, client: Client) -> None:
        if client.removed:
            return
        client.removed = True
        self.by_id.pop(client.clientid, None)
        self.per_source.add(client.source, -1)
        table = self.confirmed if client.confirmed else self.unconfirmed
        if table.get(client.owner) is client:
            del table[client.owner]

    def confirm(self, client: Client) -> Client | None:
        """Make ``client`` the owner's confirmed record; returns the record it replaces."""
        if self.unconfirmed.get(client.owner) is client:
            del self.unconfirmed[client.owner]
        old = self.confirmed.get(client.owner)
        if old is client:
            return None
        if old is not None:
            self.remove(old)
        client.confirmed = True
        self.confirmed[client.owner] = client
        return old

    def oldest_unconfirmed(self, created_before: float, source: str | None = None) -> Client | None:
        """The oldest unconfirmed record created before ``created_before`` (of ``source``)."""
        for client in self.unconfirmed.values():
            if client.created >= created_before:
                return None  # oldest first: the rest are younger
            if source is None or client.source == source:
                return client
        return None

    def exchange_id(
        self,
        owner: bytes,
        verifier: bytes,
        principal: Hashable,
        update: bool,
        now: float,
        *,
        source: str = "",
        in_use: Callable[[Client], bool],
        admit: Callable[[bool], None],
    ) -> tuple[Client, bool, list[Client]]:
        """Apply the case table. Returns (record, whether it is new, confirmed records removed
        whose state must be dropped). ``in_use(record)`` says whether a record holds state
        under an unexpired lease; ``admit(replacing)`` raises SessionError when no new record
        may be created now (``replacing``: one is removed in exchange)."""
        conf = self.confirmed.get(owner)
        unconf = self.unconfirmed.get(owner)
        if update:
            if conf is None:
                raise SessionError(nfs4.NFS4ERR_NOENT, "update of no confirmed record")  # 7
            if conf.verifier != verifier:
                raise SessionError(nfs4.NFS4ERR_NOT_SAME, "update with another verifier")  # 8
            if conf.principal != principal:
                raise SessionError(nfs4.NFS4ERR_PERM, "update by another principal")  # 9
            return conf, False, []  # 6
        dropped: list[Client] = []
        if conf is not None:
            if conf.principal != principal:  # 3
                if in_use(conf):
                    raise SessionError(nfs4.NFS4ERR_CLID_INUSE, "owner in use by another principal")
                admit(True)
                self.remove(conf)
                dropped.append(conf)
            elif conf.verifier == verifier:
                return conf, False, []  # 2
            else:
                admit(unconf is not None)  # 5
        else:
            admit(unconf is not None)  # 1 or 4
        if unconf is not None:
            self.remove(unconf)  # 4 (and 3/5 with a stale unconfirmed record)
        return self.create(owner, verifier, principal, now, source), True, dropped
