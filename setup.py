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

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """build_ext compiling the C files of the extension on every core (one per module), then
    writing ``nfsrdma/compiled.json``: each compiled module's source as it was compiled (size,
    mtime, SHA-256), by which the package tells a compiled module whose source has changed
    since (``nfsrdma/__init__.py``: it then runs the pure-Python build, with a warning)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        stamp: dict[str, list[Any]] = {}
        for source in COMPILED:
            st = os.stat(source)
            with open(source, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            stamp[os.path.relpath(source, "nfsrdma")] = [st.st_size, st.st_mtime_ns, digest]
        where = "nfsrdma" if self.inplace else os.path.join(self.build_lib, "nfsrdma")
        with open(os.path.join(where, "compiled.json"), "w") as f:
            json.dump(stamp, f, indent=0, sort_keys=True)
        if self.inplace:
            remove_unselected(where)


def remove_unselected(package: str) -> None:
    """Remove the extensions of modules this build no longer compiles: left by an in-place
    build of another selection, they would import their code from the group library, which no
    longer has it, and they are not in ``compiled.json`` to be told stale."""
    keep = {os.path.splitext(source)[0] for source in COMPILED}
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for root, _dirs, files in os.walk(package):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(suffix) and path[: -len(suffix)] not in keep:
                print(f"nfsrdma: removing {path} (not in this build's selection)", file=sys.stderr)
                os.remove(path)


# What is compiled: the hot path, where it measures faster (instructions and CPU per COMPOUND,
# both builds in one run: bench/instructions.py, bench/server_cpu.py; docs/performance.md, "The
# compiled build"). mypy/mypyc 2.4.1, CPython 3.11.
#
# CANDIDATES: the XDR runtime and the nine modules of NFSv4 types (the generated codec split in
# modules, xdr/regen.py: mypyc's analyses of one 4,900-statement module exhausted memory). The
# attribute-mask section (_nfs4_s0) is left out: 28 MB of C that gcc had not compiled in 8 min.
# Compiled alone the codecs are no faster as interpreted code uses them (attribute access on
# native classes from interpreted code costs more than on slotted Python classes), so they are
# compiled together with the code that reads their objects.
CANDIDATES: list[str] = [
    "nfsrdma/xdr/runtime.py",
    *(f"nfsrdma/xdr/gen/_nfs4_{i}.py" for i in range(9)),
]
# The COMPOUND path of the server beside the codecs, so that the message objects the codecs make
# are read by compiled code. Callgrind, instructions per COMPOUND, pure then compiled: READ
# 187k/172k, GETATTR 203k/188k.
SERVER_HOT: list[str] = [
    "nfsrdma/nfs4/compound.py",
    "nfsrdma/nfs4/context.py",
    "nfsrdma/nfs4/ops/filehandle.py",
    "nfsrdma/nfs4/ops/io.py",
    "nfsrdma/nfs4/ops/session_ops.py",
    "nfsrdma/session/server.py",
]
# The rest of a small COMPOUND's way through the server, by cProfile's own time on the pure build
# (bench/profile_compound.py read|getattr|openclose): statistics, the OPEN/CLOSE, LOOKUP and
# GETATTR operations, open and lock state, grace, the VFS's attribute values and open files,
# the local VFS with its resolver and descriptor cache, and the RPC connection. Compiled, a
# class checks the types it is given (a file handle is bytes: another type is a TypeError on
# both builds, vfs/resolver.py), takes no weak reference (the tests watch an RPC connection
# through what its context holds) and has methods a spy cannot replace (the VFS's
# one-resolution tests run on the pure build, tests/unit/vfs/conftest.py).
# Left out although they are on the way too:
# - transport/tcp: compiled, a weak reference to a connection crashed the garbage collector
#   (tests/unit/session/test_server_limits.py, a segmentation fault);
# - rpc/server: compiled, no faster by CPU per COMPOUND (and its reference path could no
#   longer be counted by the dispatch fast path's test);
# - vfs/identity: its per-thread state (a threading.local subclass with class defaults) is
#   shared by every thread once compiled (tests/unit/vfs/test_identity.py);
# - what mypyc cannot compile: tcp_receive's and transport/base's exception classes derive
#   from ConnectionError, confine's Checked from set, slots's dataclasses are generic. Beyond
#   that, tcp_receive reuses a buffer once sys.getrefcount says nothing else holds it, and
#   confine's check window is a threading.local as identity's state is: compiled, neither is
#   known to keep its meaning.
SERVER_PATH: list[str] = [
    f"nfsrdma/{m}.py"
    for m in (
        "stats/core",
        "nfs4/ops/open_close",
        "nfs4/ops/lookup",
        "nfs4/ops/attributes",
        "nfs4/state",
        "nfs4/grace",
        "vfs/attrs",
        "vfs/openfile",
        "vfs/local",
        "vfs/resolver",
        "vfs/fdcache",
        "rpc/connection",
    )
]
# The RPC-over-RDMA transport's per-message code, both directions.
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
# ``NFSRDMA_COMPILE`` picks a selection at build time: ``server`` (the default: the server's
# per-request path above and the RDMA path), ``hot`` (that and the codecs), ``rdma``,
# ``compound`` or ``candidates`` (to measure a part alone), ``none``.
# Why this default (docs/performance.md, "The server's path compiled, the codecs not", and the
# sections after it, with the figures): by CPU per COMPOUND on a quiet host (bench/server_cpu.py,
# builds alternated), it is the fastest selection measured. The codecs compiled are no faster,
# even beside compiled readers (bench/xdr_codec.py gives the same ratio to xdrlib3 on every
# build); they are most of ``hot``'s code and build (minutes, 2.5 GB), and slower than the
# interpreter under the test bed's emulation. (Callgrind's cache model,
# ``bench/instructions.py --cycles``, scored the COMPOUND path compiled at no gain: measured
# CPU time says otherwise.)
_SELECTIONS: dict[str, list[str]] = {
    "server": [*SERVER_HOT, *SERVER_PATH, *RDMA_HOT],
    "hot": [*CANDIDATES, *SERVER_HOT, *SERVER_PATH, *RDMA_HOT],
    "candidates": CANDIDATES,
    "compound": SERVER_HOT,
    "rdma": RDMA_HOT,
    "none": [],
}
_SELECTION = os.environ.get("NFSRDMA_COMPILE", "") or "server"
if _SELECTION not in _SELECTIONS:
    sys.exit(f"NFSRDMA_COMPILE={_SELECTION}: one of {', '.join(_SELECTIONS)}")
COMPILED: list[str] = _SELECTIONS[_SELECTION]


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
    reason = _why_not_compiled() or ("" if COMPILED else f"NFSRDMA_COMPILE={_SELECTION}")
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
