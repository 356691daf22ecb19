"""The client records are written as the server, whatever client the event-loop thread last
acted for (fs ids are per thread and cached by ``FsIdentity``): a squashed client cannot write
the 0700 state directory, and a DESTROY_CLIENTID after such a client's request must still take
the record off the disk."""

from __future__ import annotations

from pathlib import Path

from nfsrdma.vfs.base import Cred
from nfsrdma.vfs.clientdb import ClientDb
from nfsrdma.vfs.identity import FsIdentity

from .conftest import needs_root

NOBODY = Cred(65534, 65534, ())


@needs_root
def test_records_are_saved_as_the_server_after_a_client_identity(tmp_path: Path) -> None:
    db = ClientDb(str(tmp_path / "state" / "clients-x.json"))
    db.save({b"owner-a", b"owner-b"})
    ident = FsIdentity()
    try:
        ident.apply(NOBODY)  # as after a squashed client's OPEN on this thread
        db.save({b"owner-b"})
        ident.apply(NOBODY)
        assert db.load() == {b"owner-b"}
    finally:
        ident.apply_server()
    assert ClientDb(db.path).load() == {b"owner-b"}
