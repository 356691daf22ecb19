"""``nfsrdma conform URL``: run the conformance checks against an NFSv4.1 server.

Exit status: 0 when no check FAILs, 1 when one does, 2 for a usage error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nfsrdma.aio import run

TRANSPORT_GROUPS = ("rfc8166", "rfc8797")  # checks of the RPC-over-RDMA layer alone


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "conform",
        help="check an NFSv4.1 server's protocol conformance (over TCP or RDMA)",
        description=__doc__,
    )
    p.add_argument("url", nargs="?", help="nfs://host[:port]/path (TCP) or rdma://host[:port]/path")
    p.add_argument(
        "--only", action="append", metavar="PATTERN",
        help="run the checks whose ID or group matches (glob or substring; repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--exclude", action="append", metavar="PATTERN", help="leave these checks out (repeatable)"
    )
    p.add_argument(
        "--transport-only",
        action="store_true",
        help="only the RPC-over-RDMA transport checks (rfc8166, rfc8797; needs rdma://)",
    )
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument("--json", metavar="FILE", help="write a JSON report ('-' for stdout)")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="write the messages of failing checks as a pcap file (Wireshark: RPC-over-RDMA "
        "as RoCEv2, TCP as TCP)",
    )
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("--markdown", action="store_true", help="with --list: as Markdown tables")
    p.add_argument("--uid", type=int, default=0, help="AUTH_SYS uid (default 0)")
    p.add_argument("--gid", type=int, default=0, help="AUTH_SYS gid (default 0)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    p.add_argument(
        "--check-timeout", type=float, default=60.0, help="seconds one check may take in all"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from nfsrdma.client.url import parse_url
    from nfsrdma.conform import report
    from nfsrdma.conform.harness import Harness
    from nfsrdma.conform.registry import all_checks, select
    from nfsrdma.conform.runner import failed, run_checks

    checks = select(all_checks(), args.only, args.exclude)
    if args.transport_only:
        checks = [c for c in checks if c.group in TRANSPORT_GROUPS]
    if args.list:
        sys.stdout.write(report.markdown(checks) if args.markdown else report.listing(checks))
        return 0
    if not args.url:
        print("nfsrdma conform: a URL is needed (or --list)", file=sys.stderr)
        return 2
    try:
        url = parse_url(args.url)
    except ValueError as e:
        print(f"nfsrdma conform: {e}", file=sys.stderr)
        return 2
    if not checks:
        print("nfsrdma conform: no check matches", file=sys.stderr)
        return 2
    target = str(url)
    out = sys.stderr if args.json == "-" else sys.stdout

    def progress(i: int, n: int, o: object) -> None:
        if not args.quiet:
            print(report.progress_line(i, n, o), file=out, flush=True)  # type: ignore[arg-type]

    h = Harness(url, uid=args.uid, gid=args.gid, timeout=args.timeout)
    outcomes = run(run_checks(h, checks, limit=args.check_timeout, progress=progress))
    print(report.summary(outcomes, target), file=out)
    if args.json:
        text = report.dumps(report.to_json(outcomes, target))
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
    if args.junit:
        Path(args.junit).write_bytes(report.to_junit(outcomes, target))
    if args.trace:
        from nfsrdma.conform.pcap import to_pcap

        records = [r for o in outcomes if o.result.value == "FAIL" for r in o.wire]
        Path(args.trace).write_bytes(to_pcap(url.transport, records))
    return 1 if failed(outcomes) else 0
