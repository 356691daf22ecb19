"""The pure-Python switch (NFSRDMA_PURE): the package's finder takes a module's Python source
even where a compiled module of the same name sits beside it (which plain imports prefer)."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

import nfsrdma


def test_the_source_is_found_where_a_compiled_module_sits_beside_it(tmp_path: Path) -> None:
    (tmp_path / "codec.py").write_text("X = 1\n")
    compiled = "codec" + importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / compiled).write_bytes(b"not really an extension; never loaded here")
    plain = importlib.machinery.PathFinder.find_spec("codec", [str(tmp_path)])
    assert plain is not None and plain.origin == str(tmp_path / compiled)
    spec = nfsrdma._SourceOnly.find_spec("nfsrdma.codec", [str(tmp_path)])
    assert spec is not None and spec.origin == str(tmp_path / "codec.py")
    # Only the package's own modules are its business.
    assert nfsrdma._SourceOnly.find_spec("codec", [str(tmp_path)]) is None


def test_nfsrdma_pure_installs_the_finder_and_says_so() -> None:
    code = (
        "import sys, nfsrdma, nfsrdma.xdr.runtime as r; "
        "print(nfsrdma._SourceOnly in sys.meta_path, r.__file__.endswith('.py'), nfsrdma.build())"
    )
    env = dict(os.environ, NFSRDMA_PURE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split(maxsplit=2) == ["True", "True", "pure Python (NFSRDMA_PURE)\n"]
    env["NFSRDMA_PURE"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split(maxsplit=1)[0] == "False"
