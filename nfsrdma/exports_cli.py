"""`nfsrdma exports check FILE`: validate an exports file (the format of ``vfs/exports.py``)."""

from __future__ import annotations

import argparse
import sys

from nfsrdma.vfs.exports import FLAVORS as FLAVOR_NUMBERS
from nfsrdma.vfs.exports import ExportsError, check_paths, load

_FLAVOR_NAMES = {v: k for k, v in FLAVOR_NUMBERS.items()}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("exports", help="work with exports files (nfsrdma serve --exports)")
    cmds = p.add_subparsers(dest="exports_command", required=True, metavar="COMMAND")
    c = cmds.add_parser("check", help="validate an exports file and show what it exports")
    c.add_argument("file", help="the exports file")
    c.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    c.set_defaults(func=check)


def check(args: argparse.Namespace) -> int:
    """Exit status 0 when the file is usable, 1 (and the error, naming file and line) when
    not, 2 when it cannot be read."""
    try:
        table = load(args.file)
        check_paths(table, args.file)
    except ExportsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    if not args.quiet:
        for entry in table.entries:
            print(f"{entry.path}  fsid={entry.fsid}")
            for rule in entry.rules:
                o = rule.options
                flags = [
                    "ro" if o.read_only else "rw",
                    o.squash.value,
                    "secure" if o.secure else "insecure",
                    "sec=" + ":".join(_FLAVOR_NAMES[f] for f in o.flavors),
                ]
                if (o.anon_uid, o.anon_gid) != (65534, 65534):
                    flags += [f"anonuid={o.anon_uid}", f"anongid={o.anon_gid}"]
                print(f"    {rule.client.text}({','.join(flags)})")
        print(f"{args.file}: {len(table.entries)} export(s), ok")
    return 0
