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


PURE = os.environ.get("NFSRDMA_PURE", "") not in ("", "0")
if PURE and _SourceOnly not in sys.meta_path:
    sys.meta_path.insert(0, _SourceOnly)


def build() -> str:
    """ "compiled (mypyc: N modules)" or "pure Python": the build this process runs."""
    import nfsrdma.xdr.runtime  # noqa: F401  (at least the XDR runtime is loaded)

    compiled = sorted(
        name
        for name, mod in list(sys.modules.items())
        if name.startswith(__name__ + ".")
        and not str(getattr(mod, "__file__", "") or "").endswith((".py", ".pyc"))
        and getattr(mod, "__file__", None)
    )
    if compiled:
        return f"compiled (mypyc: {len(compiled)} modules loaded: {', '.join(compiled)})"
    return "pure Python" + (" (NFSRDMA_PURE)" if PURE else "")


if TYPE_CHECKING:
    from nfsrdma.client import connect


def __getattr__(name: str) -> Any:
    if name == "connect":
        from nfsrdma.client import connect

        return connect
    raise AttributeError(f"module 'nfsrdma' has no attribute {name!r}")
