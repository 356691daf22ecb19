"""The pure-Python switch (NFSRDMA_PURE): the package's finder takes a module's Python source
even where a compiled module of the same name sits beside it (which plain imports prefer)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
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


def test_a_compiled_module_older_than_its_source_is_told(tmp_path: Path) -> None:
    """setup.py's build records each compiled source (compiled.json); a source edited since is
    stale (the package then runs the pure build), one merely touched or reinstalled is not."""
    (tmp_path / "nfs4").mkdir()
    src = tmp_path / "nfs4" / "compound.py"
    src.write_text("X = 1\n")
    other = tmp_path / "runtime.py"
    other.write_text("Y = 2\n")
    stamp = {}
    for path in (src, other):
        st = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        stamp[str(path.relative_to(tmp_path))] = [st.st_size, st.st_mtime_ns, digest]
    (tmp_path / "compiled.json").write_text(json.dumps(stamp))
    assert nfsrdma._stale_compiled(str(tmp_path)) == []
    os.utime(other, ns=(1, 1))  # the same text at another time (a wheel's files): not stale
    assert nfsrdma._stale_compiled(str(tmp_path)) == []
    src.write_text("X = 3\n")  # edited: same size, other text
    assert nfsrdma._stale_compiled(str(tmp_path)) == ["nfs4/compound.py"]
    (tmp_path / "compiled.json").write_text("{not json")
    assert nfsrdma._stale_compiled(str(tmp_path)) == []  # no readable record: nothing to tell


def test_build_names_every_compiled_module_loaded_or_not() -> None:
    """build() names all the modules of compiled.json that would import as compiled code, in a
    fresh process that has loaded few or none of them (a server logs it before its first RDMA
    connection); with no compiled module beside its source, it says pure Python."""
    here = Path(nfsrdma.__file__).parent
    expected = sorted(
        "nfsrdma." + source.removesuffix(".py").replace("/", ".")
        for source in nfsrdma._compiled_sources(str(here))
        if any((here / source).parent.glob(Path(source).stem + ".cpython-*.so"))
    )
    code = "import nfsrdma; print(nfsrdma.build())"
    env = {k: v for k, v in os.environ.items() if k != "NFSRDMA_PURE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    said = out.stdout.strip()
    if not expected or nfsrdma._stale_compiled(str(here)):
        assert said.startswith("pure Python")
        return
    assert said == f"compiled (mypyc: {len(expected)} modules: {', '.join(expected)})"
