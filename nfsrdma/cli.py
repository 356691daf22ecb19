"""The `nfsrdma` command. Each command family lives in its own module that exposes
``register(subparsers)``; a registered sub-parser sets ``func(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# Modules that contribute sub-commands (each imports its heavy dependencies lazily).
COMMAND_MODULES = (
    "nfsrdma.server_cli",
    "nfsrdma.exports_cli",
    "nfsrdma.testbed.cli",
    "nfsrdma.client.cli",
    "nfsrdma.conform.cli",
    "nfsrdma.stats.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nfsrdma",
        description="An NFSv4.1 server and client over RPC-over-RDMA version 1 and TCP.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Our own loggers follow -v; everything else (pyverbs logs every object at INFO) stays at
    # WARNING.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("nfsrdma").setLevel(logging.WARNING - 10 * min(args.verbose, 2))
    rc: int = args.func(args)
    return rc
