"""Regenerate the committed XDR codecs from the specifications: ``python -m nfsrdma.xdr.regen``.

``--check`` regenerates in memory and fails if a committed module differs (the test suite and
``make test`` run it), so the generated code can never drift from its specification.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nfsrdma.xdr import fattrgen, nfs4_fattr
from nfsrdma.xdr.codegen import Generator, OperationTable, Options, generate
from nfsrdma.xdr.parser import parse

HERE = Path(__file__).parent
SPECS = HERE / "specs"
GEN = HERE / "gen"


@dataclass(frozen=True)
class Target:
    spec: str  # file under specs/
    module: str  # module under gen/
    doc: str
    ddp_fields: frozenset[tuple[str, str]] = frozenset()
    operation_tables: tuple[OperationTable, ...] = ()
    peeks: tuple[str, ...] = ()
    sections: tuple[Callable[[Generator], list[str]], ...] = ()
    # Above 0: written as this many modules of types plus one per section, ``module``
    # re-exporting them (``Generator.generate_split``: small enough for mypyc, setup.py).
    parts: int = 0


# The DDP-eligible items of NFSv4 (RFC 8267 section 6.1): WRITE data and symlink text in
# calls, READ data and READLINK text in replies. Only these may ever move into chunks (UL-1).
NFS4_DDP = frozenset(
    {
        ("WRITE4args", "data"),
        ("createtype4", "linkdata"),
        ("READ4resok", "data"),
        ("READLINK4resok", "link"),
    }
)

# COMPOUND and CB_COMPOUND: operations by number, and their headers read without the operations.
NFS4_OPERATIONS = (
    OperationTable("OPERATIONS", "nfs_opnum4", "nfs_argop4", "nfs_resop4", "OP_", "OPERATION_"),
    OperationTable(
        "CB_OPERATIONS",
        "nfs_cb_opnum4",
        "nfs_cb_argop4",
        "nfs_cb_resop4",
        "OP_CB_",
        "CB_OPERATION_",
    ),
)
NFS4_PEEKS = ("COMPOUND4args", "COMPOUND4res", "CB_COMPOUND4args", "CB_COMPOUND4res")

# How many modules the NFSv4 types are split into (besides the attribute section's): each
# small enough for mypyc to compile in bounded memory (docs/performance.md).
NFS4_PARTS = 8

TARGETS = (
    Target("rpc.x", "rpc", "ONC RPC version 2 messages (RFC 5531)."),
    Target("rpcsec_gss.x", "rpcsec_gss", "The RPCSEC_GSS security flavor, version 1 (RFC 2203)."),
    Target("rpcrdma.x", "rpcrdma", "RPC-over-RDMA version 1 transport header (RFC 8166)."),
    Target(
        "nfs4.x",
        "nfs4",
        "NFSv4.1 and NFSv4.2 protocol and callback program (RFC 5662, RFC 7863, RFC 8276).",
        NFS4_DDP,
        NFS4_OPERATIONS,
        NFS4_PEEKS,
        (fattrgen.section(nfs4_fattr.TABLE),),
        parts=NFS4_PARTS,
    ),
)


def render(t: Target) -> dict[str, str]:
    """The generated modules of a target: module name (under gen/) -> text."""
    spec = parse((SPECS / t.spec).read_text(encoding="utf-8"))
    doc = f"{t.doc} Generated from nfsrdma/xdr/specs/{t.spec}."
    options = Options(
        ddp_fields=set(t.ddp_fields),
        module_doc=doc,
        operation_tables=t.operation_tables,
        peeks=t.peeks,
        sections=t.sections,
    )
    if t.parts:
        return Generator(spec, options).generate_split("nfsrdma.xdr.gen", t.module, t.parts)
    return {t.module: generate(spec, options)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="fail if a generated module is stale")
    ap.add_argument("targets", nargs="*", help="spec files to process (default: all present)")
    args = ap.parse_args(argv)
    stale = []
    for t in TARGETS:
        if args.targets and t.spec not in args.targets:
            continue
        if not (SPECS / t.spec).exists():
            print(f"missing specification {SPECS / t.spec}", file=sys.stderr)
            return 1
        for module, text in render(t).items():
            out = GEN / f"{module}.py"
            if args.check:
                if not out.exists() or out.read_text(encoding="utf-8") != text:
                    stale.append(str(out))
            else:
                out.write_text(text, encoding="utf-8")
                print(f"wrote {out}")
    if stale:
        print("stale generated modules (run python -m nfsrdma.xdr.regen): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
