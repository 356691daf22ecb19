"""What the confinement check costs PUTFH (issue 9, hole 1).

``LocalVfs.check`` (what PUTFH calls) on hot cached handles, with the check (every use of a
cached descriptor re-establishes that the object is inside the export) and without it (the
descriptor cache alone, as before), the two interleaved in one process so that a shared,
loaded machine affects both alike; the minimum of many rounds. Served from the detached mount
clone (root's default) and without it (unprivileged servers). Needs root for the clone. Then
each call in a check window of its own, as PUTFH in a COMPOUND: without and with the move watch
(``vfs/confine.py``: checked once, then trusted while nothing on the file system moves;
``*_watch_on`` says whether the export could have it).

    PYTHONPATH=$PWD .venv/bin/python bench/putfh_confinement.py [--rounds 25] [--calls 5000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from nfsrdma.vfs import Cred, Export, LocalVfs, confine

ROOT = Cred(0, 0, ())


def measure(clone: bool, rounds: int, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as t:
        export = os.path.join(t, "export")
        deep = os.path.join(export, *[f"d{i}" for i in range(8)])
        os.makedirs(deep)
        for d in (export, deep):
            open(os.path.join(d, "f"), "w").close()
        vfs = LocalVfs(
            Export(export, state_dir=os.path.join(t, "state"), root_squash=False),
            clone_mount=clone,
        )
        try:
            res = vfs._res
            root = vfs.root_handle()
            file1 = vfs.lookup(ROOT, root, b"f")
            d = root
            for i in range(8):
                d = vfs.lookup(ROOT, d, f"d{i}".encode())
            file9 = vfs.lookup(ROOT, d, b"f")
            checked, unchecked = res._acquire_inside, res.fds.acquire
            cases = {"file_depth1": file1, "dir_depth8": d, "file_depth9": file9}
            best: dict[str, float] = {}
            for _ in range(rounds):
                for name, fh in cases.items():
                    for mode, acquire in (("before", unchecked), ("after", checked)):
                        res._acquire_inside = acquire  # type: ignore[method-assign]
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            vfs.check(fh)
                        us = (time.perf_counter() - t0) / calls * 1e6
                        key = f"{name}_{mode}_us"
                        best[key] = min(best.get(key, us), us)
                    # As PUTFH in a COMPOUND of its own: a check window around each call, with
                    # the move watch (the descriptor trusted while nothing moves) and without.
                    res._acquire_inside = checked  # type: ignore[method-assign]
                    watched = res.watched
                    for mode, watch in (("window", False), ("watched", watched)):
                        res.watched = watch
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            confine.open_window()
                            vfs.check(fh)
                            confine.close_window()
                        us = (time.perf_counter() - t0) / calls * 1e6
                        key = f"{name}_{mode}_us"
                        best[key] = min(best.get(key, us), us)
                    res.watched = watched
            best["watch_on"] = float(watched)
            return best
        finally:
            vfs.release_identity()
            vfs.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    figures: dict[str, float] = {}
    for clone in (True, False):
        tag = "clone" if clone else "noclone"
        best = measure(clone, args.rounds, args.calls)
        for name in ("file_depth1", "dir_depth8", "file_depth9"):
            b, a = best[f"{name}_before_us"], best[f"{name}_after_us"]
            win, wat = best[f"{name}_window_us"], best[f"{name}_watched_us"]
            print(
                f"{tag:8} {name:12} PUTFH {b:6.2f} us -> {a:6.2f} us (+{a - b:.2f} us); "
                f"one per window {win:6.2f} us, with the move watch {wat:6.2f} us"
            )
        figures[f"{tag}_before_us"] = best["file_depth9_before_us"]
        figures[f"{tag}_after_us"] = best["file_depth9_after_us"]
        figures[f"{tag}_added_us"] = best["file_depth9_after_us"] - best["file_depth9_before_us"]
        figures[f"{tag}_window_us"] = best["file_depth9_window_us"]
        figures[f"{tag}_watched_us"] = best["file_depth9_watched_us"]
        figures[f"{tag}_watch_on"] = best["watch_on"]
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
