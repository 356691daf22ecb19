"""The fuzz campaign of ``bench/fuzz_campaign.py`` for a short N: mutated COMPOUNDs through the
server's real connection handler (and some through a loopback socket), mutated RPC-over-RDMA
headers, RFC 8797 private data and CB_COMPOUNDs into our client. No crash, no hang, no reply
with a wrong XID. The full campaign (10**6 COMPOUNDs, ...) is the bench script's default."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "fuzz_campaign.py"


def figures(last_line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in last_line.split())


@pytest.mark.parametrize("seed", [7, 8])
def test_short_campaign_finds_no_crash_hang_or_wrong_xid(seed: int) -> None:
    argv = [
        sys.executable, str(SCRIPT), "--seed", str(seed), "--compounds", "3000",
        "--headers", "20000", "--privdata", "5000", "--cb", "1500", "--tcp-every", "20", "--check",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = done.stdout.strip().splitlines()
    assert out, done.stderr[-3000:]
    got = figures(out[-1])
    assert got["compounds"] == "3000" and got["headers"] == "20000", out[-1]
    assert got["privdata"] == "5000" and got["cb"] == "1500", out[-1]
    assert (got["crashes"], got["hangs"], got["wrong_xid"]) == ("0", "0", "0"), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _load_campaign() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("fuzz_campaign", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("fuzz_campaign", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_a_parser_raising_an_undocumented_error_counts_as_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The campaign's crash detector works: a header parser that raises something other than
    HeaderError on some input is reported, with the input."""
    fc = _load_campaign()
    real = fc.rh.parse

    def brittle(buf: bytes) -> object:
        if len(buf) % 7 == 3:
            raise IndexError("planted")
        return real(buf)

    monkeypatch.setattr(fc.rh, "parse", brittle)
    catcher = fc.ErrorCatcher()
    figs = fc.header_campaign(2000, 1, catcher, fc.Rss(), 1e9)
    assert figs.inputs == 2000
    planted = [c for c in catcher.crashes if "planted" in c.what]
    assert planted and all(len(c.data) % 7 == 3 for c in planted)


@pytest.mark.parametrize("size", [1 << 63, (1 << 64) - 1])
async def test_setattr_size_beyond_the_largest_file_is_fbig(tmp_path: Path, size: int) -> None:
    """Found by the campaign (seed 1, 10**6 COMPOUNDs): SETATTR of a size above 2**63 - 1
    reached os.truncate, whose OverflowError became NFS4ERR_SERVERFAULT with a traceback.
    Minimised: SEQUENCE, PUTROOTFH, LOOKUP of a file, SETATTR(size) -> NFS4ERR_FBIG."""
    import asyncio
    import struct

    from nfsrdma.rpc.auth import auth_sys
    from nfsrdma.server import NFSServer
    from nfsrdma.xdr.gen import nfs4

    fc = _load_campaign()
    export = tmp_path / "export"
    export.mkdir()
    (export / "f").write_bytes(b"data")
    server = NFSServer(str(export), bind="127.0.0.1", tcp_port=0, rdma_port=None,
                       root_squash=False, state_dir=str(tmp_path))  # fmt: skip
    await server.start()
    catcher = fc.ErrorCatcher()
    try:
        with catcher.installed():
            asyncio.get_running_loop().set_exception_handler(catcher.loop_handler)
            link = fc.Link(server, "t", fc.Figures(), catcher)
            calls = fc.Calls(auth_sys(uid=0, gid=0, machinename="t"))
            session = fc.Session(link, calls, b"fbig-test")
            await session.setup(10.0)
            size_attr = nfs4.fattr4([1 << nfs4.FATTR4_SIZE], struct.pack(">Q", size))
            ops = [
                session.sequence(0),
                fc.op(nfs4.OP_PUTROOTFH),
                fc.op(nfs4.OP_LOOKUP, nfs4.LOOKUP4args(b"f")),
                fc.op(nfs4.OP_SETATTR, nfs4.SETATTR4args(nfs4.stateid4(0, bytes(12)), size_attr)),
            ]
            msg, _ = calls.compound(ops)
            rec = await link.call(msg, 10.0)
            link.close()
    finally:
        await server.close()
    assert rec is not None
    res = fc.decode_res(rec)
    assert res is not None and [r.resop for r in res.resarray][-1] == nfs4.OP_SETATTR
    assert res.status == nfs4.NFS4ERR_FBIG, nfs4.nfsstat4(res.status).name
    assert catcher.crashes == []
    assert (export / "f").read_bytes() == b"data"
