"""Exports with client rules through the real server over TCP loopback: raw COMPOUNDs from
several source addresses (127.0.0.1, 127.0.0.2, ... are other clients), and SIGHUP reload of
`nfsrdma serve --exports` in a child process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nfsrdma.rpc.auth import AUTH_NONE_CRED, auth_sys
from nfsrdma.rpc.connection import RpcConnection
from nfsrdma.server import NFSServer
from nfsrdma.transport.tcp import TcpConnection
from nfsrdma.xdr.gen import nfs4, rpc
from nfsrdma.xdr.runtime import Writer

from ..session.helpers import op, op_create_session, op_exchange_id, op_sequence, resok, statuses

OK = nfs4.NFS4_OK
ROOT = auth_sys(0, 0, (), "exports-test")
USER = auth_sys(1000, 1000, (), "exports-test")
KRB5_OID = bytes.fromhex("2a864886f712010202")
REPO = Path(__file__).resolve().parents[3]


async def connect_from(source: str, port: int, source_port: int = 0) -> RpcConnection:
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((source, source_port))
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    _, proto = await loop.create_connection(lambda: TcpConnection(f"127.0.0.1:{port}"), sock=sock)
    return RpcConnection(proto)


class Client:
    """One client ID and session over one connection from ``source``."""

    def __init__(self, conn: RpcConnection, name: bytes) -> None:
        self.conn = conn
        self.name = name
        self.sid = b""
        self.seq = 0

    @classmethod
    async def open(cls, source: str, port: int, source_port: int = 0) -> Client:
        c = cls(await connect_from(source, port, source_port), f"c-{source}-{source_port}".encode())
        res = await c.raw([op_exchange_id(c.name)], ROOT)
        eir = resok(res, 0)
        create = op_create_session(eir.eir_clientid, eir.eir_sequenceid)
        create.value.csa_fore_chan_attrs.ca_maxoperations = 32  # test paths are deep
        res = await c.raw([create], ROOT)
        c.sid = resok(res, 0).csr_sessionid
        return c

    async def raw(self, ops: list[nfs4.nfs_argop4], cred: rpc.opaque_auth) -> Any:
        def enc(w: Writer) -> None:
            nfs4.enc_COMPOUND4args(w, nfs4.COMPOUND4args(b"", 1, ops))

        r = await self.conn.call(nfs4.NFS4_PROGRAM, nfs4.NFS_V4, 1, enc, cred=cred, timeout=10)
        res, _ = nfs4.dec_COMPOUND4res(r.reader, r.offset)
        return res

    async def call(self, ops: list[nfs4.nfs_argop4], cred: rpc.opaque_auth = USER) -> Any:
        self.seq += 1
        res = await self.raw([op_sequence(self.sid, self.seq), *ops], cred)
        assert statuses(res)[0] == OK
        return res

    async def last(self, ops: list[nfs4.nfs_argop4], cred: rpc.opaque_auth = USER) -> int:
        """The status of the COMPOUND (that of its last operation run)."""
        return int((await self.call(ops, cred)).status)

    def close(self) -> None:
        self.conn.close()


def lookups(path: Path | str) -> list[nfs4.nfs_argop4]:
    return [op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(p.encode())) for p in Path(path).parts[1:]]


def putroot() -> nfs4.nfs_argop4:
    return op(nfs4.OP_PUTROOTFH)


def readdir() -> nfs4.nfs_argop4:
    return op(nfs4.OP_READDIR, nfs4.READDIR4args(0, bytes(8), 4096, 8192, []))


def mkdir(name: str) -> nfs4.nfs_argop4:
    return op(
        nfs4.OP_CREATE,
        nfs4.CREATE4args(nfs4.createtype4(nfs4.NF4DIR), name.encode(), nfs4.fattr4([], b"")),
    )


def getfsid() -> nfs4.nfs_argop4:
    return op(nfs4.OP_GETATTR, nfs4.GETATTR4args([1 << nfs4.FATTR4_FSID]))


def fsid_of(res: Any, i: int) -> tuple[int, int]:
    major, minor = struct.unpack(">QQ", resok(res, i).obj_attributes.attr_vals)
    return major, minor


def listed(res: Any) -> list[bytes]:
    return sorted(e.name for e in resok(res, len(res.resarray) - 1).reply.entries)


def write_exports(path: Path, tree: Path, team_rules: str) -> None:
    path.write_text(
        f"# test exports\n"
        f"{tree}/srv/pub   *(ro,insecure,sec=sys:none)\n"
        f"{tree}/srv/team  {team_rules}\n"
        f"{tree}/home/krb  127.0.0.2(rw,insecure,no_root_squash,sec=krb5p:krb5i:krb5:sys) \\\n"
        f"                 127.0.0.1(rw,secure,no_root_squash)\n"
    )


def release(server: NFSServer) -> None:
    """Give this thread (the event loop's, where the server ran) back its own identity."""
    if server.state is not None:
        server.state.vfs.release_identity()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[NFSServer, Path]]:
    tree = tmp_path / "t"
    for d in ("srv/pub", "srv/team", "home/krb"):
        (tree / d).mkdir(parents=True)
    exports = tmp_path / "exports"
    write_exports(exports, tree, "127.0.0.1(rw,insecure,no_root_squash) 127.0.0.2(ro,insecure)")
    server = NFSServer(
        "/",
        bind="127.0.0.1",
        tcp_port=0,
        rdma_port=None,
        state_dir=str(tmp_path / "state"),
        exports_file=str(exports),
    )
    await server.start()
    try:
        yield server, tree
    finally:
        release(server)
        await server.close()


async def test_clients_see_and_may_do_what_their_rules_say(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, tree):
        await _rules(server, tree)


async def _rules(server: NFSServer, tree: Path) -> None:
    port = server.tcp_port
    a = await Client.open("127.0.0.1", port)
    b = await Client.open("127.0.0.2", port)
    c = await Client.open("127.0.0.3", port)
    try:
        # The pseudo-root: each client sees the paths to its exports only.
        # A has a rule for /home/krb (secure) but none for /srv/pub's siblings... all shown.
        assert listed(await a.call([putroot(), *lookups(tree), readdir()])) == [b"home", b"srv"]
        assert listed(await b.call([putroot(), *lookups(tree), readdir()])) == [b"home", b"srv"]
        assert listed(await c.call([putroot(), *lookups(tree), readdir()])) == [b"srv"]
        assert listed(await c.call([putroot(), *lookups(tree / "srv"), readdir()])) == [b"pub"]
        # Into an export it has no rule for: NFS4ERR_ACCESS on LOOKUP, and on PUTFH of a
        # handle it got elsewhere.
        assert await c.last([putroot(), *lookups(tree / "srv/team")]) == nfs4.NFS4ERR_ACCESS
        res = await a.call([putroot(), *lookups(tree / "srv/team"), op(nfs4.OP_GETFH), getfsid()])
        n = len(res.resarray)
        team_fh = resok(res, n - 2).object
        team_fsid = fsid_of(res, n - 1)
        put_team = op(nfs4.OP_PUTFH, nfs4.PUTFH4args(team_fh))
        assert await c.last([put_team, getfsid()]) == nfs4.NFS4ERR_ACCESS
        # fsid: the pseudo fs has its own, each export another.
        res = await a.call([putroot(), getfsid(), *lookups(tree / "srv/pub"), getfsid()])
        assert fsid_of(res, 2) == (0, 0)
        pub_fsid = fsid_of(res, len(res.resarray) - 1)
        assert len({(0, 0), pub_fsid, team_fsid}) == 3
        # rw for A, ro for B on the same export.
        assert await a.last([put_team, mkdir("by-a")], ROOT) == OK
        assert await b.last([put_team, mkdir("by-b")], ROOT) == nfs4.NFS4ERR_ROFS
        assert os.path.isdir(tree / "srv/team/by-a")
        assert not os.path.exists(tree / "srv/team/by-b")
        # A handle of one export presented with another export's fsid: NFS4ERR_BADHANDLE.
        res = await a.call([putroot(), *lookups(tree / "srv/pub"), op(nfs4.OP_GETFH)])
        pub_fh = resok(res, len(res.resarray) - 1).object
        forged = pub_fh[:4] + team_fh[4:]
        assert await a.last([op(nfs4.OP_PUTFH, nfs4.PUTFH4args(forged))]) == (
            nfs4.NFS4ERR_BADHANDLE
        )
        # 'secure': A reaches /home/krb only from a privileged source port.
        assert await a.last([putroot(), *lookups(tree / "home/krb")]) == nfs4.NFS4ERR_ACCESS
    finally:
        for x in (a, b, c):
            x.close()
    privileged = await Client.open("127.0.0.1", port, source_port=1000)
    try:
        assert await privileged.last([putroot(), *lookups(tree / "home/krb")]) == OK
    finally:
        privileged.close()


async def test_secinfo_and_wrongsec(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, tree):
        await _secinfo(server, tree)


async def _secinfo(server: NFSServer, tree: Path) -> None:
    b = await Client.open("127.0.0.2", server.tcp_port)
    try:
        home = [putroot(), *lookups(tree / "home")]
        # AUTH_NONE is not among /home/krb's flavours: NFS4ERR_WRONGSEC crossing into it
        # (the pseudo fs above it accepts any flavour).
        res = await b.call([*home, op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"krb"))], AUTH_NONE_CRED)
        assert statuses(res)[-2:] == [OK, nfs4.NFS4ERR_WRONGSEC]
        # SECINFO answers with the export's flavours in the order written.
        res = await b.call([*home, op(nfs4.OP_SECINFO, nfs4.SECINFO4args(b"krb"))], AUTH_NONE_CRED)
        assert res.status == OK
        flavors = res.resarray[-1].value.value
        gss = [f.value for f in flavors[:3]]
        assert [f.flavor for f in flavors] == [nfs4.RPCSEC_GSS] * 3 + [nfs4.AUTH_SYS]
        assert [g.service for g in gss] == [
            nfs4.RPC_GSS_SVC_PRIVACY,
            nfs4.RPC_GSS_SVC_INTEGRITY,
            nfs4.RPC_GSS_SVC_NONE,
        ]
        assert all(g.oid == KRB5_OID and g.qop == 0 for g in gss)
        # SECINFO_NO_NAME of an export: the same list; PUTFH itself does not refuse.
        res = await b.call([*home, op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"krb")), op(nfs4.OP_GETFH)])
        krb_fh = resok(res, len(res.resarray) - 1).object
        res = await b.call(
            [
                op(nfs4.OP_PUTFH, nfs4.PUTFH4args(krb_fh)),
                op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH),
            ],
            AUTH_NONE_CRED,
        )
        assert res.status == OK
        assert [f.flavor for f in res.resarray[-1].value.value] == [nfs4.RPCSEC_GSS] * 3 + [1]
        # ... but followed by anything else (READDIR, GETATTR, VERIFY), PUTFH is refused
        # itself (RFC 8881 section 2.6.3.1.1.7).
        put_krb = op(nfs4.OP_PUTFH, nfs4.PUTFH4args(krb_fh))
        res = await b.call([put_krb, readdir()], AUTH_NONE_CRED)
        assert statuses(res)[1:] == [nfs4.NFS4ERR_WRONGSEC]
        res = await b.call([put_krb, getfsid()], AUTH_NONE_CRED)
        assert statuses(res)[1:] == [nfs4.NFS4ERR_WRONGSEC]
        verify = nfs4.VERIFY4args(nfs4.fattr4([], b""))
        res = await b.call([put_krb, op(nfs4.OP_VERIFY, verify)], AUTH_NONE_CRED)
        assert statuses(res)[1:] == [nfs4.NFS4ERR_WRONGSEC]
        assert statuses(await b.call([put_krb, getfsid()]))[1:] == [OK, OK]  # AUTH_SYS listed
        # /srv/pub says sec=sys:none.
        res = await b.call(
            [putroot(), *lookups(tree / "srv"), op(nfs4.OP_SECINFO, nfs4.SECINFO4args(b"pub"))]
        )
        assert [f.flavor for f in res.resarray[-1].value.value] == [nfs4.AUTH_SYS, nfs4.AUTH_NONE]
        assert (
            await b.last([putroot(), *lookups(tree / "srv/pub"), readdir()], AUTH_NONE_CRED) == OK
        )
    finally:
        b.close()


async def test_reload_applies_to_the_next_request(tmp_path: Path) -> None:
    async with serving(tmp_path) as (server, tree):
        await _reload(server, tree, tmp_path)


async def _reload(server: NFSServer, tree: Path, tmp_path: Path) -> None:
    c = await Client.open("127.0.0.3", server.tcp_port)
    try:
        team = [putroot(), *lookups(tree / "srv/team")]
        assert await c.last(team) == nfs4.NFS4ERR_ACCESS
        exports = tmp_path / "exports"
        write_exports(exports, tree, "127.0.0.3(rw,insecure,no_root_squash)")
        assert server.reload_exports()
        # Same connection, same session: the new rule applies.
        assert await c.last([*team, mkdir("by-c")], ROOT) == OK
        # A bad file is refused; the rules in force stay.
        exports.write_text(f"{tree}/srv/team *(rw,warp_speed)\n")
        assert not server.reload_exports()
        assert await c.last([*team, mkdir("again")], ROOT) == OK
        exports.write_text(f"{tree}/srv/pub *(ro,insecure)\n{tree}/gone *(rw)\n")
        assert not server.reload_exports()  # an export that is no directory
        assert await c.last(team) == OK
    finally:
        c.close()


async def test_single_directory_serve_is_unchanged(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    export.chmod(0o777)
    server = NFSServer(
        str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None, state_dir=str(tmp_path / "s")
    )
    await server.start()
    c = await Client.open("127.0.0.4", server.tcp_port)
    try:
        # The directory is the pseudo-root, any address and port, AUTH_SYS or AUTH_NONE.
        assert await c.last([putroot(), mkdir("d")]) == OK
        res = await c.call([putroot(), op(nfs4.OP_SECINFO_NO_NAME, nfs4.SECINFO_STYLE4_CURRENT_FH)])
        assert [f.flavor for f in res.resarray[-1].value.value] == [nfs4.AUTH_SYS, nfs4.AUTH_NONE]
        assert await c.last([putroot(), readdir()], AUTH_NONE_CRED) == OK
    finally:
        c.close()
        release(server)
        await server.close()


def _wait_for_line(proc: subprocess.Popen[bytes], text: str, seen: list[str]) -> None:
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"server exited before {text!r}: {''.join(seen)}")


async def test_sighup_reloads_the_file(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    (tree / "srv/team").mkdir(parents=True)
    (tree / "srv/pub").mkdir(parents=True)
    exports = tmp_path / "exports"
    exports.write_text(f"{tree}/srv/pub *(ro,insecure)\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nfsrdma",
            "serve",
            "--exports",
            str(exports),
            "--bind",
            "127.0.0.1",
            "--tcp-port",
            str(port),
            "--no-rdma",
            "--state-dir",
            str(tmp_path / "st"),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, _wait_for_line, proc, "serving", seen)
        c = await Client.open("127.0.0.5", port)
        try:
            srv = [putroot(), *lookups(tree / "srv"), readdir()]
            assert listed(await c.call(srv)) == [b"pub"]
            exports.write_text(f"{tree}/srv/pub *(ro,insecure)\n{tree}/srv/team *(rw,insecure)\n")
            proc.send_signal(signal.SIGHUP)
            await loop.run_in_executor(None, _wait_for_line, proc, "exports reloaded", seen)
            assert listed(await c.call(srv)) == [b"pub", b"team"]
            exports.write_text(f"{tree}/srv/pub *(ro,insecure,frobnicate)\n")
            proc.send_signal(signal.SIGHUP)
            await loop.run_in_executor(None, _wait_for_line, proc, "exports not reloaded", seen)
            assert "unknown option 'frobnicate'" in seen[-1]
            assert listed(await c.call(srv)) == [b"pub", b"team"]
        finally:
            c.close()
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_serve_refuses_a_bad_exports_file(tmp_path: Path) -> None:
    exports = tmp_path / "exports"
    exports.write_text(f"{tmp_path} *(rw,nonsense)\n")
    out = subprocess.run(
        [sys.executable, "-m", "nfsrdma", "serve", "--exports", str(exports), "--no-rdma"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert f"{exports}:1: unknown option 'nonsense'" in out.stderr.decode()


def _fsuid() -> int:
    """The calling thread's file-system uid (the fourth field of its ``Uid:`` line)."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[4])
    raise AssertionError("no Uid: line")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")
def test_reload_reads_the_exports_file_as_the_server(tmp_path: Path) -> None:
    """A TCP-only server's loop thread switches to each caller's identity in place
    (vfs/identity.py); SIGHUP's reload runs on that thread and must still read a root-only
    exports file and open the exports as the server, whoever the last caller was. (In a
    thread of its own: a thread that once ran an RDMA server stays protected.)"""
    seen: list[object] = []

    async def scenario() -> None:
        async with serving(tmp_path) as (server, tree):
            (tmp_path / "exports").chmod(0o600)
            c = await Client.open("127.0.0.1", server.tcp_port)
            try:
                await c.last([putroot(), *lookups(tree / "srv/team"), mkdir("by-user")], USER)
            finally:
                c.close()
            seen.append(_fsuid())  # the loop thread acts as the last caller
            seen.append(server.reload_exports())

    def run() -> None:
        try:
            asyncio.run(scenario())
        except BaseException as e:
            seen.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [1000, True]
