"""Thread safety: many threads, a tiny descriptor cache, mixed identities."""

from __future__ import annotations

import threading
from pathlib import Path

from nfsrdma.vfs import Cred, FileType

from .conftest import ROOT, MakeVfs, needs_root

pytestmark = needs_root


def test_parallel_lookups_reads_and_writes_with_constant_eviction(
    make_vfs: MakeVfs, export_dir: Path
) -> None:
    vfs = make_vfs(root_squash=False, fd_cache_size=3)
    root = vfs.root_handle()
    dirs = [vfs.create(ROOT, root, b"d%d" % i, FileType.NF4DIR, 0o777) for i in range(4)]
    errors: list[str] = []

    def worker(n: int) -> None:
        cred = Cred(1000 + n, 1000 + n, ())
        try:
            for i in range(60):
                d = dirs[(n + i) % len(dirs)]
                name = b"t%d-%d" % (n, i)
                fh, of, _ = vfs.create_file(cred, d, name, 0o600)
                payload = name * 100
                of.write(0, payload)
                of.close()
                again = vfs.lookup(cred, d, name)
                if again != fh:
                    errors.append(f"handle changed for {name!r}")
                data, eof = vfs.anonymous_read(cred, fh, 0, len(payload) + 10)
                if data != payload or not eof:
                    errors.append(f"bad data for {name!r}")
                if vfs.getattr(fh).uid != cred.uid:
                    errors.append("wrong owner")
                if i % 3 == 0:
                    vfs.remove(cred, d, name)
        except Exception as e:
            errors.append(repr(e))
        finally:
            vfs.release_identity()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = sum(len(vfs.readdir(ROOT, d).entries) for d in dirs)
    assert total == 6 * 40
