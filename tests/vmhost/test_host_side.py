"""The test bed's host-side and pure pieces, without booting a VM (fast)."""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

import pytest

from nfsrdma.testbed import check, cli, guest, vm
from nfsrdma.testbed.constants import OUT_MARKER
from nfsrdma.testbed.helpers import (
    parse_mountstats,
    rdma_listening_ports,
    tcp_listening_ports,
)
from nfsrdma.testbed.perftest import parse_bw
from nfsrdma.testbed.spec import GuestSpec, SpecError

MOUNTSTATS = """\
device proc mounted on /proc with fstype proc
device 10.77.0.1:/ mounted on /tmp/testbed-mnt/a\\040b-0 with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,rsize=524288,wsize=524288,namlen=255,acregmin=3,proto=rdma,port=20049,sec=sys
\tage:\t3
\tbytes:\t0 16777216 0 0 16777216 16777216 0 4096
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\trdma 0 0 1 0 0 20 20 0 20 0 0 0 4 22708 920 24 0 56112 0 0 0 0 0 11 0 0 0
\tper-op statistics
\t        NULL: 0 0 0 0 0 0 0 0 0
device 10.77.0.1:/ mounted on /tmp/m2 with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,proto=tcp
\txprt:\ttcp 877 0 2 0 0 14 14 0 14 0 2 0 0
"""

PERFTEST = """\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      100              31.25              29.37  \t\t   0.000470
---------------------------------------------------------------------------------------
"""


def test_mountstats_parse() -> None:
    proc, rdma, tcp = parse_mountstats(MOUNTSTATS)
    assert proc.fstype == "proc" and proc.xprt is None
    assert rdma.mountpoint == "/tmp/testbed-mnt/a b-0"
    assert (rdma.device, rdma.fstype, rdma.xprt) == ("10.77.0.1:/", "nfs4", "rdma")
    assert rdma.opts["proto"] == "rdma" and rdma.opts["port"] == "20049"
    assert rdma.server_read_bytes == 16777216 and rdma.server_write_bytes == 16777216
    assert rdma.xprt_fields[:3] == (0, 0, 1)
    assert tcp.xprt == "tcp" and tcp.server_read_bytes == 0


def test_listening_ports() -> None:
    proc_net = (
        "  sl  local_address rem_address   st tx_queue rx_queue\n"
        "   0: 00000000:0801 00000000:0000 0A 00000000:00000000\n"
        "   1: 0100007F:9C40 0100007F:0801 01 00000000:00000000\n"
    )
    assert tcp_listening_ports(proc_net) == {2049}
    res = (
        "link rxe0/- cm-idn 0 state LISTEN ps TCP comm [rpcrdma] src-addr 0.0.0.0:20049 \n"
        "link rxe0/- cm-idn 1 state LISTEN ps TCP comm [rpcrdma] src-addr :::20049 \n"
        "link rxe0/1 cm-idn 2 state CONNECT ps TCP comm rping src-addr 10.77.0.1:7471 \n"
        "link -/- cm-idn 3 state LISTEN ps TCP pid 12 comm rping src-addr 10.77.0.1:7471 \n"
    )
    assert rdma_listening_ports(res) == {20049, 7471}


def test_perftest_parse() -> None:
    r = parse_bw(PERFTEST)
    assert (r.msg_bytes, r.iterations) == (65536, 100)
    assert r.average_mib_s == 29.37
    assert r.average_mb_s == pytest.approx(29.37 * 1.048576)
    with pytest.raises(ValueError):
        parse_bw("no result here")


def test_spec_round_trip_and_errors() -> None:
    spec = GuestSpec(out_dir="/o", cwd="/c", knfsd=True, command=("a", "b c"), env={"X": "1"})
    assert GuestSpec.from_json(spec.to_json()) == spec
    for bad in ('{"out_dir": "/o", "cwd": "/c"}', "[]", "{", '{"out_dir": 1, "cwd": "/c"}'):
        with pytest.raises(SpecError):
            GuestSpec.from_json(bad)


def _cfg(tmp_path: Path, out: Path | None = None) -> vm.VmConfig:
    return vm.VmConfig(
        kernel=Path("/boot/vmlinuz-x"), vng="vng", out_dir=out or tmp_path, cwd=tmp_path
    )


def test_vng_argv_tcg_no_network(tmp_path: Path) -> None:
    argv = vm.vng_argv(_cfg(tmp_path), exec_cmd="python -m x spec")
    assert argv[0] == "vng" and "--disable-kvm" in argv
    assert argv[argv.index("--rwdir") + 1] == str(tmp_path)
    assert "module_blacklist=kvm,kvm_amd,kvm_intel" in argv[argv.index("--append") + 1]
    assert argv[-2:] == ["--exec", "python -m x spec"]
    # The guest stays off any network: virtme-ng's default -net none, never --network.
    assert not any(a.startswith(("--network", "-n", "--net")) for a in argv)
    with pytest.raises(vm.TestbedError):
        vm.vng_argv(_cfg(tmp_path, tmp_path / "a,b"), exec_cmd="x")


def test_vng_argv_qemu_opts_one_word_after_vngs_own(tmp_path: Path) -> None:
    """--qemu-opts reaches vng as one ``--qemu-opts=...`` word (vng's parser would read a
    separate value beginning with "-" as an option), before --exec; none without it."""
    assert not any(a.startswith("--qemu-opts") for a in vm.vng_argv(_cfg(tmp_path), exec_cmd="x"))
    opts = vm.parse_qemu_opts("-accel tcg,tb-size=2048 -cpu 'qemu64'")
    assert opts == ("-accel", "tcg,tb-size=2048", "-cpu", "qemu64")
    cfg = vm.VmConfig(
        kernel=Path("/boot/vmlinuz-x"), vng="vng", out_dir=tmp_path, cwd=tmp_path, qemu_opts=opts
    )
    argv = vm.vng_argv(cfg, exec_cmd="x")
    assert argv[-3:] == ["--qemu-opts=-accel tcg,tb-size=2048 -cpu qemu64", "--exec", "x"]


@pytest.mark.parametrize(
    "text",
    [
        "-netdev user,id=n0",
        "-accel tcg -nic user",
        "-net=nic",
        "--device virtio-net-pci",
        "-device e1000",
        "-cpu 'max",  # unbalanced quote
    ],
)
def test_qemu_opts_refuses_devices_network_and_bad_quoting(text: str) -> None:
    with pytest.raises(vm.TestbedError, match="--qemu-opts"):
        vm.parse_qemu_opts(text)


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--qemu-opts", "-nic user", "could give the guest a network"),
        ("--append", "init=/bin/sh", "would replace the test bed's init"),
    ],
)
def test_cli_options_refused_before_boot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, said: str
) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(
        ["testbed", "run", "--out", str(tmp_path), option, value, "--", "true"]
    )
    assert args.func(args) == vm.EXIT_MISSING
    assert said in capsys.readouterr().err


def test_append_words_follow_the_test_beds_own(tmp_path: Path) -> None:
    """--append adds words to the guest kernel's command line after the test bed's own
    (kvm's modules stay blacklisted); without it the line is the test bed's alone."""
    own = vm.vng_argv(_cfg(tmp_path), exec_cmd="x")
    assert own[own.index("--append") + 1] == vm.KERNEL_APPEND
    words = vm.parse_append("pti=off 'spec_store_bypass_disable=off'")
    assert words == ("pti=off", "spec_store_bypass_disable=off")
    cfg = vm.VmConfig(
        kernel=Path("/boot/vmlinuz-x"),
        vng="vng",
        out_dir=tmp_path,
        cwd=tmp_path,
        extra_append=words,
    )
    argv = vm.vng_argv(cfg, exec_cmd="x")
    line = argv[argv.index("--append") + 1]
    assert line == f"{vm.KERNEL_APPEND} pti=off spec_store_bypass_disable=off"


@pytest.mark.parametrize("text", ["init=/bin/sh", "quiet rdinit=/x", "pti='off"])
def test_append_refuses_another_init_and_bad_quoting(text: str) -> None:
    with pytest.raises(vm.TestbedError, match="--append"):
        vm.parse_append(text)


def test_prepare_out_dir_wipes_only_its_own(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    out = vm.prepare_out_dir(foreign)
    assert (out / "keep.txt").exists() and (out / OUT_MARKER).exists()  # first use: kept
    (out / "sub").mkdir()
    (out / "sub" / "junit.xml").write_text("old")
    vm.prepare_out_dir(foreign)  # a test-bed out dir now: emptied
    assert sorted(p.name for p in out.iterdir()) == [OUT_MARKER]


def test_find_kernel_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vm.KERNEL_ENV, raising=False)
    for rel in ("6.1.0-9-amd64", "6.1.0-56-amd64", "5.10.0-30-amd64"):
        (tmp_path / f"vmlinuz-{rel}").write_bytes(b"")
    found = vm.find_kernel(tmp_path)
    assert found is not None and found.name == "vmlinuz-6.1.0-56-amd64"
    assert vm.find_kernel(tmp_path / "empty") is None


def test_run_vm_relays_output_and_exit_code(
    tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    script = "echo 'testbed: guest up' >&2; echo out-line; echo err-line >&2; exit 3"
    result = vm.run_vm(["sh", "-c", script], timeout_s=60, console_log=tmp_path / "c.log")
    assert (result.exit_code, result.timed_out) == (3, False)
    assert result.first_output_s is not None
    captured = capfdbinary.readouterr()
    assert b"out-line" in captured.out and b"err-line" in captured.err
    assert b"out-line" in (tmp_path / "c.log").read_bytes()


def test_run_vm_timeout_kills_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    t = time.monotonic()
    result = vm.run_vm(["sh", "-c", script], timeout_s=1, console_log=None)
    assert result.timed_out and result.exit_code == vm.EXIT_TIMEOUT
    assert time.monotonic() - t < 30
    child = int(pidfile.read_text())
    assert _exits(child, within=10)  # the grandchild (qemu's place) is gone too


def _exits(pid: int, within: float) -> bool:
    """True once ``pid`` has terminated (a pidfd turns readable then): an event, with
    ``within`` seconds as a guard only."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already gone (and reaped)
    try:
        readable, _, _ = select.select([fd], [], [], within)
        return bool(readable)
    finally:
        os.close(fd)


def test_cli_run_without_command_or_vng(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["testbed", "run", "--out", str(tmp_path), "--"])
    assert args.func(args) == 2
    monkeypatch.setattr(vm, "find_vng", lambda: None)
    args = parser.parse_args(["testbed", "run", "--out", str(tmp_path), "--", "true"])
    assert args.func(args) == vm.EXIT_MISSING
    assert "nfsrdma testbed check" in capsys.readouterr().err


def test_check_reports_missing_with_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(check, "_which", lambda tool: None if tool == "rping" else f"/x/{tool}")
    monkeypatch.setattr(check, "find_vng", lambda: None)
    text, ok = check.report(check.run_checks())
    assert not ok
    assert "MISSING  rping" in text
    assert "--no-install-recommends rdmacm-utils" in text
    assert f"{sys.executable} -m pip install 'virtme-ng>=1.30'" in text
    assert check.module_names("kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz: a.ko\n") == {
        "rdma_rxe"
    }


def test_guest_pieces() -> None:
    assert guest.format_kmsg("6,339,5140900,-;NFSD: hello\n SUBSYSTEM=x") == (
        "[    5.140900] NFSD: hello\n"
    )
    assert guest.exit_code(-9) == 137 and guest.exit_code(3) == 3
    spec = GuestSpec(out_dir="/o", cwd="/c", command=("x",), path_prepend=("/venv/bin",))
    env = guest.command_env(spec)
    assert env["TESTBED_ADDR"] == "10.77.0.1" and env["TESTBED_OUT"] == "/o"
    assert "TESTBED_EXPORT" not in env
    assert env["PATH"].startswith("/venv/bin" + os.pathsep)
    env = guest.command_env(GuestSpec(out_dir="/o", cwd="/c", knfsd=True, command=("x",)))
    assert env["TESTBED_EXPORT"] == "/srv/nfsrdma-export"
