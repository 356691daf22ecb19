"""``python -m nfsrdma.testbed run|shell|check``: the same as ``nfsrdma testbed ...``, without
loading the other command families."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nfsrdma.testbed import cli


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nfsrdma.testbed")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli.register(sub)
    args = parser.parse_args(["testbed", *(sys.argv[1:] if argv is None else argv)])
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
