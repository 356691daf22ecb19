"""``nfsrdma ls|stat|cat|get|put|cp|rm|mkdir|mv|bench``: the client from the command line.

Every remote path is a URL, ``nfs://host[:port]/path`` (TCP) or ``rdma://host[:port]/path``;
paths are absolute on the server (its NFSv4 pseudo-root is ``/``). Large transfers show a
progress bar on a terminal; ``--json`` prints machine-readable output where it fits.
Exit status: 0, or 1 when an operation failed (the error goes to stderr)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import posixpath
import stat as stat_mod
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

from nfsrdma.aio import run
from nfsrdma.client import connect
from nfsrdma.client.attrs import FileStat
from nfsrdma.client.bench import plot, run_bench
from nfsrdma.client.fs import NfsClient
from nfsrdma.client.url import NfsUrl, is_url, parse_url

BLOCK = 16 << 20  # bytes per read/write call in transfers (each split and pipelined)
PROGRESS_MIN = 4 << 20


# -- connections ---------------------------------------------------------------------------------
@dataclass
class Clients:
    """One client per server named on the command line."""

    args: argparse.Namespace
    open: dict[tuple[str, str, int], NfsClient]

    async def get(self, url: NfsUrl) -> NfsClient:
        key = (url.scheme, url.host, url.port)
        client = self.open.get(key)
        if client is None:
            root = NfsUrl(url.scheme, url.host, url.port, "/")
            client = await connect(
                root,
                uid=self.args.uid,
                gid=self.args.gid,
                slots=self.args.slots,
                rsize=self.args.rsize,
                wsize=self.args.wsize,
                timeout=self.args.timeout,
                sec=getattr(self.args, "sec", "sys"),
            )
            self.open[key] = client
        return client

    async def close(self) -> None:
        for client in self.open.values():
            with contextlib.suppress(OSError):
                await client.aclose()


@contextlib.asynccontextmanager
async def clients(args: argparse.Namespace) -> AsyncIterator[Clients]:
    c = Clients(args, {})
    try:
        yield c
    finally:
        await c.close()


# -- output --------------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on stderr (only when it is a terminal, or forced)."""

    def __init__(self, total: int, label: str, enabled: bool, out: TextIO | None = None) -> None:
        self.total = total
        self.label = os.path.basename(label.rstrip("/")) or label
        self.done = 0
        self.out = out if out is not None else sys.stderr
        self.enabled = enabled and total >= PROGRESS_MIN
        self.t0 = time.perf_counter()
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            self.out.write("\r" + self.line(now))
            self.out.flush()

    def line(self, now: float) -> str:
        frac = self.done / self.total if self.total else 1.0
        width = 30
        bar = "#" * int(frac * width)
        rate = self.done / max(now - self.t0, 1e-9) / 1e6
        return (
            f"{self.label[:30]:30s} [{bar:{width}s}] {frac * 100:5.1f}% "
            f"{self.done / 2**20:8.1f} MiB {rate:7.1f} MB/s"
        )

    def finish(self) -> None:
        if self.enabled:
            self.out.write("\n")
            self.out.flush()


def _mode_string(st: FileStat) -> str:
    return stat_mod.filemode(st.st_mode)


def _long_line(name: str, st: FileStat | None) -> str:
    if st is None:
        return f"?????????? {'?':>4} {'?':>6} {'?':>6} {'?':>12} {'':16} {name}"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.st_mtime))
    return (
        f"{_mode_string(st)} {st.st_nlink:>4} {st.owner:>6} {st.group:>6} "
        f"{st.st_size:>12} {when} {name}"
    )


def _print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


# -- commands ------------------------------------------------------------------------------------
async def cmd_ls(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {}
    async with clients(args) as cs:
        for u in args.urls:
            url = parse_url(u)
            fs = await cs.get(url)
            st = await fs.stat(url.path)
            entries: list[tuple[str, FileStat | None]]
            if not st.is_dir():
                entries = [(posixpath.basename(url.path), st)]
            else:
                entries = sorted(
                    [(e.name, e.stat) async for e in fs.scandir(url.path)],
                    key=lambda x: x[0],
                )
            if args.json:
                out[str(url)] = [{"name": n, **(s.as_dict() if s else {})} for n, s in entries]
                continue
            if len(args.urls) > 1:
                print(f"{url}:")
            for name, est in entries:
                print(_long_line(name, est) if args.long else name)
    if args.json:
        _print_json(out if len(args.urls) > 1 else next(iter(out.values())))
    return 0


async def cmd_stat(args: argparse.Namespace) -> int:
    out: dict[str, Any] = {}
    async with clients(args) as cs:
        for u in args.urls:
            url = parse_url(u)
            st = await (await cs.get(url)).stat(url.path, follow_symlinks=not args.no_follow)
            if args.json:
                out[str(url)] = st.as_dict()
            else:
                print(f"  File: {url}")
                print(f"  Size: {st.st_size:<12} Blocks: {st.st_blocks:<8} {_mode_string(st)}")
                print(f" Inode: {st.st_ino:<12} Links: {st.st_nlink:<8} Device: {st.st_dev:#x}")
                print(f" Owner: {st.owner} ({st.st_uid})  Group: {st.group} ({st.st_gid})")
                for label, ns in (
                    ("Access", st.st_atime_ns),
                    ("Modify", st.st_mtime_ns),
                    ("Change", st.st_ctime_ns),
                ):
                    secs = ns / 1e9
                    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(secs))
                    print(f"{label}: {stamp}.{ns % 1_000_000_000:09d}")
    if args.json:
        _print_json(out if len(args.urls) > 1 else next(iter(out.values())))
    return 0


async def copy_out(fs: NfsClient, path: str, sink: BinaryIO, progress: Progress) -> int:
    """Remote file to a local stream, BLOCK bytes per pipelined read."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    total = 0
    async with fs.open(path, "rb") as f:
        while True:
            n = await f.readinto(view)
            if n == 0:
                break
            sink.write(view[:n])
            total += n
            progress.update(n)
            if n < len(view):
                more = await f.readinto(view)  # the end, unless the file grew
                if more == 0:
                    break
                sink.write(view[:more])
                total += more
                progress.update(more)
    progress.finish()
    return total


async def copy_in(source: BinaryIO, fs: NfsClient, path: str, progress: Progress) -> int:
    """A local stream to a remote file, BLOCK bytes per pipelined write."""
    total = 0
    async with fs.open(path, "wb") as f:
        while True:
            block = source.read(BLOCK)
            if not block:
                break
            await f.write(block)
            total += len(block)
            progress.update(len(block))
    progress.finish()
    return total


def _show_progress(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    return sys.stderr.isatty()


async def cmd_cat(args: argparse.Namespace) -> int:
    async with clients(args) as cs:
        for u in args.urls:
            url = parse_url(u)
            fs = await cs.get(url)
            await copy_out(fs, url.path, sys.stdout.buffer, Progress(0, "", False))
    sys.stdout.flush()
    return 0


async def _get(cs: Clients, src: NfsUrl, dst: str, args: argparse.Namespace) -> dict[str, Any]:
    fs = await cs.get(src)
    st = await fs.stat(src.path)
    if os.path.isdir(dst):
        dst = os.path.join(dst, posixpath.basename(src.path))
    t0 = time.perf_counter()
    with open(dst, "wb") as sink:
        n = await copy_out(fs, src.path, sink, Progress(st.st_size, dst, _show_progress(args)))
    return _transfer(str(src), dst, n, t0)


async def _put(cs: Clients, src: str, dst: NfsUrl, args: argparse.Namespace) -> dict[str, Any]:
    fs = await cs.get(dst)
    path = dst.path
    with contextlib.suppress(FileNotFoundError):
        if (await fs.stat(path)).is_dir():
            path = posixpath.join(path, os.path.basename(src))
    size = os.path.getsize(src)
    t0 = time.perf_counter()
    with open(src, "rb") as source:
        n = await copy_in(source, fs, path, Progress(size, src, _show_progress(args)))
    return _transfer(src, str(dst.with_path(path)), n, t0)


async def _remote_copy(
    cs: Clients, src: NfsUrl, dst: NfsUrl, args: argparse.Namespace
) -> dict[str, Any]:
    sfs, dfs = await cs.get(src), await cs.get(dst)
    st = await sfs.stat(src.path)
    path = dst.path
    with contextlib.suppress(FileNotFoundError):
        if (await dfs.stat(path)).is_dir():
            path = posixpath.join(path, posixpath.basename(src.path))
    progress = Progress(st.st_size, str(src), _show_progress(args))
    t0 = time.perf_counter()
    if sfs is dfs and sfs.minor_version >= 2:
        # One server speaking NFSv4.2: COPY there, the data never comes here.
        shown = 0

        def advanced(done: int, _total: int) -> None:
            nonlocal shown
            progress.update(done - shown)
            shown = done

        try:
            total = await sfs.copy_file(src.path, path, progress=advanced)
        except OSError as e:
            if e.errno != errno.EOPNOTSUPP:
                raise
        else:
            progress.finish()
            return {**_transfer(str(src), str(dst.with_path(path)), total, t0), "server_copy": True}
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    total = 0
    async with sfs.open(src.path, "rb") as fin, dfs.open(path, "wb") as fout:
        while (n := await fin.readinto(view)) > 0:
            await fout.write(view[:n])
            total += n
            progress.update(n)
    progress.finish()
    return _transfer(str(src), str(dst.with_path(path)), total, t0)


def _transfer(src: str, dst: str, n: int, t0: float) -> dict[str, Any]:
    secs = time.perf_counter() - t0
    return {
        "from": src,
        "to": dst,
        "bytes": n,
        "seconds": round(secs, 3),
        "mb_per_s": round(n / max(secs, 1e-9) / 1e6, 1),
    }


async def cmd_get(args: argparse.Namespace) -> int:
    async with clients(args) as cs:
        src = parse_url(args.url)
        dst = args.local or posixpath.basename(src.path) or "."
        result = await _get(cs, src, dst, args)
    if args.json:
        _print_json(result)
    return 0


async def cmd_put(args: argparse.Namespace) -> int:
    async with clients(args) as cs:
        result = await _put(cs, args.local, parse_url(args.url), args)
    if args.json:
        _print_json(result)
    return 0


async def cmd_cp(args: argparse.Namespace) -> int:
    src, dst = args.src, args.dst
    async with clients(args) as cs:
        if is_url(src) and is_url(dst):
            result = await _remote_copy(cs, parse_url(src), parse_url(dst), args)
        elif is_url(src):
            result = await _get(cs, parse_url(src), dst, args)
        elif is_url(dst):
            result = await _put(cs, src, parse_url(dst), args)
        else:
            raise SystemExit("nfsrdma cp: one side must be an nfs:// or rdma:// URL")
    if args.json:
        _print_json(result)
    return 0


async def _remove_tree(fs: NfsClient, path: str) -> None:
    async for e in fs.scandir(path):
        if e.is_dir():
            await _remove_tree(fs, e.path)
        else:
            await fs.remove(e.path)
    await fs.rmdir(path)


async def cmd_rm(args: argparse.Namespace) -> int:
    async with clients(args) as cs:
        for u in args.urls:
            url = parse_url(u)
            fs = await cs.get(url)
            try:
                st = await fs.lstat(url.path)
            except FileNotFoundError:
                if args.force:
                    continue
                raise
            if st.is_dir():
                if not args.recursive:
                    raise IsADirectoryError(f"{url} is a directory (use -r)")
                await _remove_tree(fs, url.path)
            else:
                await fs.remove(url.path)
    return 0


async def cmd_mkdir(args: argparse.Namespace) -> int:
    async with clients(args) as cs:
        for u in args.urls:
            url = parse_url(u)
            fs = await cs.get(url)
            if args.parents:
                await fs.makedirs(url.path, mode=args.mode, exist_ok=True)
            else:
                await fs.mkdir(url.path, mode=args.mode)
    return 0


async def cmd_mv(args: argparse.Namespace) -> int:
    src, dst = parse_url(args.src), parse_url(args.dst)
    if (src.scheme, src.host, src.port) != (dst.scheme, dst.host, dst.port):
        raise SystemExit("nfsrdma mv: both URLs must name the same server")
    async with clients(args) as cs:
        fs = await cs.get(src)
        target = dst.path
        with contextlib.suppress(FileNotFoundError):
            if (await fs.stat(target)).is_dir():
                target = posixpath.join(target, posixpath.basename(src.path))
        await fs.rename(src.path, target)
    return 0


async def cmd_bench(args: argparse.Namespace) -> int:
    url = parse_url(args.url)
    async with clients(args) as cs:
        fs = await cs.get(url)
        result = await run_bench(
            fs,
            size=args.size << 20,
            block=args.block << 20,
            files=args.files,
            concurrency=args.concurrency,
            directory=posixpath.join(url.path, f".nfsrdma-bench-{os.getpid()}"),
        )
    if args.json:
        _print_json(result.as_dict())
    else:
        print(
            f"{url} ({result.session['transport']}, {result.session['slots']} slots, "
            f"rsize {result.session['rsize']}, wsize {result.session['wsize']})"
        )
        for line in result.lines():
            print(line)
    if args.plot:
        plot(result, args.plot)
    return 0


# -- wiring --------------------------------------------------------------------------------------
def _runner(
    fn: Callable[[argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    def run_command(args: argparse.Namespace) -> int:
        try:
            return run(fn(args))  # type: ignore[arg-type]
        except KeyboardInterrupt:
            return 130
        except (OSError, ValueError, NotImplementedError) as e:
            print(f"nfsrdma {args.command}: {e}", file=sys.stderr)
            return 1

    return run_command


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--uid", type=int, default=os.getuid(), help="AUTH_SYS uid (default: yours)")
    p.add_argument("--gid", type=int, default=os.getgid(), help="AUTH_SYS gid (default: yours)")
    p.add_argument("--slots", type=int, default=64, help="session slots to ask for")
    p.add_argument("--rsize", type=int, default=1 << 20, help="largest READ (bytes)")
    p.add_argument("--wsize", type=int, default=1 << 20, help="largest WRITE (bytes)")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds before a silent server's connection is replaced",
    )
    p.add_argument(
        "--sec",
        choices=("sys", "krb5", "krb5i", "krb5p", "auto"),
        default="sys",
        help="security: AUTH_SYS, Kerberos (your credential cache) or auto (SECINFO_NO_NAME)",
    )


def _progress_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    g.add_argument("--no-progress", dest="progress", action="store_false")


def register(subparsers: Any) -> None:
    def add(
        name: str,
        fn: Callable[[argparse.Namespace], Awaitable[int]],
        help: str,
        json_flag: bool = False,
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=help)
        _common(p)
        if json_flag:
            p.add_argument("--json", action="store_true", help="JSON output")
        p.set_defaults(func=_runner(fn))
        return p

    p = add("ls", cmd_ls, "list directories (READDIR with attributes)", json_flag=True)
    p.add_argument("-l", dest="long", action="store_true", help="long listing")
    p.add_argument("urls", nargs="+", metavar="URL")

    p = add("stat", cmd_stat, "show file attributes", json_flag=True)
    p.add_argument(
        "-L",
        "--no-follow",
        dest="no_follow",
        action="store_true",
        help="do not follow a final symbolic link",
    )
    p.add_argument("urls", nargs="+", metavar="URL")

    p = add("cat", cmd_cat, "write remote files to stdout")
    p.add_argument("urls", nargs="+", metavar="URL")

    p = add("get", cmd_get, "copy a remote file here", json_flag=True)
    _progress_flags(p)
    p.add_argument("url", metavar="URL")
    p.add_argument("local", nargs="?", metavar="LOCAL")

    p = add("put", cmd_put, "copy a local file to the server", json_flag=True)
    _progress_flags(p)
    p.add_argument("local", metavar="LOCAL")
    p.add_argument("url", metavar="URL")

    p = add("cp", cmd_cp, "copy between local paths and URLs (either side remote)", json_flag=True)
    _progress_flags(p)
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")

    p = add("rm", cmd_rm, "remove files (and directories with -r)")
    p.add_argument("-r", "--recursive", action="store_true")
    p.add_argument("-f", "--force", action="store_true", help="ignore missing files")
    p.add_argument("urls", nargs="+", metavar="URL")

    p = add("mkdir", cmd_mkdir, "make directories")
    p.add_argument("-p", "--parents", action="store_true")
    p.add_argument("-m", "--mode", type=lambda s: int(s, 8), default=0o755)
    p.add_argument("urls", nargs="+", metavar="URL")

    p = add("mv", cmd_mv, "rename on the server")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")

    p = add(
        "bench",
        cmd_bench,
        "measure read/write throughput and small-operation rates",
        json_flag=True,
    )
    p.add_argument("url", metavar="URL", help="a directory to work in")
    p.add_argument("--size", type=int, default=64, help="transfer size in MiB")
    p.add_argument("--block", type=int, default=16, help="bytes per read/write call, MiB")
    p.add_argument("--files", type=int, default=200, help="files for the small operations")
    p.add_argument("--concurrency", type=int, default=16, help="small operations in flight")
    p.add_argument("--plot", metavar="FILE", help="also write a PNG chart (needs matplotlib)")


def main(argv: list[str] | None = None) -> int:
    """The client commands alone (``python -m nfsrdma.client.cli``)."""
    parser = argparse.ArgumentParser(prog="nfsrdma", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
