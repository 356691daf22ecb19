"""The operation table: every module in this package is one family of operations and exposes
``HANDLERS: dict[int, OpHandler]`` keyed by nfs_opnum4. Operations with no handler here get
NFS4ERR_NOTSUPP (which is also the answer NFSv4.1 requires for the NFSv4.0-only operations)."""

from __future__ import annotations

import importlib
import pkgutil

from nfsrdma.nfs4.context import OpHandler


def _collect() -> dict[int, OpHandler]:
    table: dict[int, OpHandler] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for op, handler in getattr(module, "HANDLERS", {}).items():
            if op in table:
                raise RuntimeError(f"operation {op} has two handlers ({info.name})")
            table[op] = handler
    return table


HANDLERS: dict[int, OpHandler] = _collect()
