"""Build of nfsrdma: pure Python, plus the hot path compiled by mypyc when it can be.

``pip install .`` (or ``python setup.py build_ext --inplace`` in a checkout) compiles the
modules of ``COMPILED`` into C extensions when mypyc (it ships with mypy) and a C compiler with
the Python headers are present, and falls back to the pure-Python package otherwise, saying
why. ``NFSRDMA_PURE=1`` forces the pure build; at run time the same variable makes the package
ignore compiled modules that are present (``nfsrdma/__init__.py``). Each compiled module is the
same source as its pure-Python twin: both builds behave the same, and the test suite runs on
both (``make test``).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """build_ext compiling the C files of the extension on every core (one per module)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


# Compiled only where it measures faster (bench/xdr_codec.py, bench/server_cpu.py, both builds in
# one run). Measured with mypy/mypyc 2.4.1, CPython 3.11: nothing does yet, so nothing is.
# The generated NFSv4 codec now compiles (split into modules, xdr/regen.py): CANDIDATES, the XDR
# runtime and the nine modules of NFSv4 types, build in 210-226 s of CPU (mypyc, then gcc -O3;
# 4.4 GB peak, mostly mypy's analysis). Compiled, the codecs are no faster as the benchmarks use
# them (xdr_codec ratio 1.78-1.79 against 1.77 pure, same run) and the server is no faster, its
# OPEN/CLOSE pair slower (server_cpu, two rounds, us per COMPOUND, pure then compiled: READ
# 35/41 and 44/36, GETATTR 45/48 and 45/45, OPEN/CLOSE 78/101 and 83/92; with the COMPOUND path
# trimmed, READ 26.5/28.4, GETATTR 31.7/32.8, OPEN/CLOSE 64.5/76.1): the server, interpreted,
# builds and reads the message objects, and attribute access on native classes from
# interpreted code costs more than on slotted Python classes. Kept Python classes (a decorator
# mypyc does not know), the compiled codec is slower (ratio 1.49-1.52). The attribute-mask
# section (_nfs4_s0) gives 28 MB of C that gcc had not compiled in 8 minutes: too slow to build.
# ``NFSRDMA_COMPILE=candidates`` builds CANDIDATES, to measure again (docs/performance.md).
CANDIDATES: list[str] = [
    "nfsrdma/xdr/runtime.py",
    *(f"nfsrdma/xdr/gen/_nfs4_{i}.py" for i in range(9)),
]
# The COMPOUND path of the server beside the codecs, so that the message objects the codecs make
# are read by compiled code (``NFSRDMA_COMPILE=hot``; ``server`` builds these alone, quickly).
# Measured (server_cpu, us per COMPOUND, pure then hot, same rounds): READ 24.7/21.6, GETATTR
# 30.3/26.9, OPEN/CLOSE 63.4/74.2 (slower: its interpreted modules read native objects); about
# 3 min of CPU to build. ``server`` alone (codecs interpreted): no faster. Not compiled by
# default: the host suite fails on it (24 of the first 106 tests of tests/unit/nfs4, session,
# vfs; docs/performance.md).
SERVER_HOT: list[str] = [
    "nfsrdma/nfs4/compound.py",
    "nfsrdma/nfs4/context.py",
    "nfsrdma/nfs4/ops/filehandle.py",
    "nfsrdma/nfs4/ops/io.py",
    "nfsrdma/nfs4/ops/session_ops.py",
    "nfsrdma/session/server.py",
]
# The RPC-over-RDMA transport's per-message code, both directions (issue 12, ``rdmapath``).
RDMA_HOT: list[str] = [
    f"nfsrdma/transport/rdma/{m}.py"
    for m in (
        "calls",
        "connection_base",
        "continuation",
        "credits",
        "endpoint",
        "header",
        "marshal",
        "pool",
        "privdata",
        "requester",
        "responder",
        "rtrext",
        "rtrheader",
        "sendqueue",
    )
]
_SELECTIONS: dict[str, list[str]] = {
    "candidates": CANDIDATES,
    "hot": [*CANDIDATES, *SERVER_HOT, *RDMA_HOT],
    "server": SERVER_HOT,
    "rdma": RDMA_HOT,
}
COMPILED: list[str] = _SELECTIONS.get(os.environ.get("NFSRDMA_COMPILE", ""), [])


def _why_not_compiled() -> str:
    """Empty when the compiled build can be made; otherwise the reason it cannot."""
    if os.environ.get("NFSRDMA_PURE", "") not in ("", "0"):
        return "NFSRDMA_PURE is set"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy)"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    include = sysconfig.get_paths().get("include", "")
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers in {include} (python3-dev)"
    return ""


def ext_modules() -> list[Any]:
    reason = _why_not_compiled() or ("" if COMPILED else "no module measures faster compiled")
    if reason:
        print(f"nfsrdma: pure-Python build: {reason}", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    print(f"nfsrdma: compiling {len(COMPILED)} modules with mypyc", file=sys.stderr)
    return list(
        mypycify(
            COMPILED,
            opt_level=os.environ.get("NFSRDMA_OPT", "3"),
            multi_file=True,  # one C file per module: smaller compiler runs, in parallel
            group_name="nfsrdma_native",
        )
    )


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
