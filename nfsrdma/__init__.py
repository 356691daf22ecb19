"""nfsrdma: an asyncio NFSv4.1 client and server over RPC-over-RDMA version 1 and TCP.

``nfsrdma.connect("nfs://host/path")`` opens the async client (see :mod:`nfsrdma.client`);
it is imported on first use, so ``import nfsrdma`` stays light.

The hot path may be compiled (mypyc, see ``setup.py``); ``NFSRDMA_PURE=1`` in the environment
makes the package import its Python sources even where compiled modules sit beside them, and
``build()`` says which build runs."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "build", "connect"]


class _SourceOnly:
    """A meta path finder for ``nfsrdma.*`` that finds ``.py`` files only (NFSRDMA_PURE)."""

    @classmethod
    def find_spec(cls, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + ".") or path is None:
            return None
        from importlib.machinery import SOURCE_SUFFIXES, FileFinder, SourceFileLoader

        for entry in path:
            spec = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def _compiled_sources(here: str) -> dict[str, list[Any]]:
    """``compiled.json`` of the package in ``here`` (empty if there is none): each compiled
    module's source path and its size, mtime and SHA-256 as compiled."""
    try:
        with open(os.path.join(here, "compiled.json"), "rb") as f:
            import json

            built: dict[str, list[Any]] = json.load(f)
    except (OSError, ValueError):
        return {}
    return built


def _stale_compiled(here: str) -> list[str]:
    """The compiled modules of the package in ``here`` whose source differs from what was
    compiled (``compiled.json``, written by setup.py's build): a checkout edited since its last
    build. Sizes and times first; a file whose time moved (an installed wheel) is compared by
    its SHA-256."""
    stale = []
    for source, (size, mtime_ns, digest) in _compiled_sources(here).items():
        path = os.path.join(here, source)
        try:
            st = os.stat(path)
            if st.st_size == size and st.st_mtime_ns == mtime_ns:
                continue
            with open(path, "rb") as f:
                import hashlib

                if hashlib.sha256(f.read()).hexdigest() == digest:
                    continue
        except OSError:
            continue  # (no source beside it: nothing to tell it from)
        stale.append(source)
    return stale


PURE = os.environ.get("NFSRDMA_PURE", "") not in ("", "0")
# A compiled module older than its source would run code that is no longer there: the sources
# run instead (the pure build) until the next build (``setup.py build_ext --inplace``).
STALE = [] if PURE else _stale_compiled(os.path.dirname(__file__))
if STALE:
    import warnings

    warnings.warn(
        f"nfsrdma: compiled modules older than their sources ({', '.join(STALE)}): running "
        "the pure-Python build; rebuild with: python setup.py build_ext --inplace",
        stacklevel=2,
    )
if (PURE or STALE) and _SourceOnly not in sys.meta_path:
    sys.meta_path.insert(0, _SourceOnly)


def compiled_modules() -> list[str]:
    """The modules of ``compiled.json`` that import as compiled code (loaded or not yet), by
    name; empty in the pure build."""
    from importlib.util import find_spec

    compiled = []
    for source in sorted(_compiled_sources(os.path.dirname(__file__))):
        name = __name__ + "." + source.removesuffix(".py").replace("/", ".")
        try:
            spec = find_spec(name)
        except ImportError:
            continue
        if spec is not None and spec.origin and not spec.origin.endswith(".py"):
            compiled.append(name)
    return compiled


def build() -> str:
    """ "compiled (mypyc: N modules: ...)" or "pure Python": the build this process runs
    (:func:`compiled_modules`)."""
    compiled = compiled_modules()
    if compiled:
        return f"compiled (mypyc: {len(compiled)} modules: {', '.join(compiled)})"
    if STALE:
        return "pure Python (compiled modules older than their sources)"
    return "pure Python" + (" (NFSRDMA_PURE)" if PURE else "")


if TYPE_CHECKING:
    from nfsrdma.client import connect


def __getattr__(name: str) -> Any:
    if name == "connect":
        from nfsrdma.client import connect

        return connect
    raise AttributeError(f"module 'nfsrdma' has no attribute {name!r}")
