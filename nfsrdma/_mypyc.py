"""``mypyc_attr`` for the modules mypyc compiles, without making mypy a dependency.

mypyc reads the decorator (``mypy_extensions.mypyc_attr``) when it compiles a class, and the
compiled class never calls it; the pure-Python build calls it, and ``mypy_extensions`` (which
ships with mypy) may be missing there, so a decorator that does nothing stands in for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["mypyc_attr"]

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:

        def mypyc_attr(*attrs, **kwattrs):
            return lambda cls: cls
