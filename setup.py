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

# Compiled only where it measures faster (bench/server_cpu.py, bench/xdr_codec.py, both builds in
# one run). Measured with mypy/mypyc 2.4: nothing does yet. The generated NFSv4 codec
# (xdr/gen/nfs4.py) is where compiling would pay, and mypyc cannot build it: its module
# initialiser (some 4,500 top-level statements: the types, their tables) makes mypyc's dataflow
# analysis run out of memory (over 6 GB, then killed). Compiled alone, the XDR runtime made
# the (pure) codecs slower (xdr_codec ratio 1.69 against 2.01: native attribute access from
# Python code costs more), and the RPC and RPC-over-RDMA header codecs were no faster (7.5 us
# against 7.4 us for a header parse, encode and call decode): their work is already in
# ``struct``. Candidates, when mypyc can take the generated module whole or it is split:
# "nfsrdma/xdr/runtime.py", "nfsrdma/xdr/gen/rpc.py", "nfsrdma/xdr/gen/rpcrdma.py",
# "nfsrdma/xdr/gen/nfs4.py", "nfsrdma/nfs4/compound.py".
COMPILED: list[str] = []


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
    return list(mypycify(COMPILED, opt_level=os.environ.get("NFSRDMA_OPT", "3")))


setup(ext_modules=ext_modules())
