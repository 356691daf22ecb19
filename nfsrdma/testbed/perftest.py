"""perftest (``ib_write_bw``, ``ib_read_bw``, ...) in loopback on rxe0 inside the guest:
a server and a client on the same device, connected through RDMA-CM."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from nfsrdma.testbed.constants import RXE_DEVICE
from nfsrdma.testbed.helpers import Background, CommandError, rdma_listening, run, testbed_addr

# perftest's "MB/sec" is 2**20 bytes per second.
MIB = 1 << 20

_RESULT_RE = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class BwResult:
    msg_bytes: int
    iterations: int
    peak_mib_s: float
    average_mib_s: float
    msg_rate_mpps: float

    @property
    def average_mb_s(self) -> float:
        """Average bandwidth in MB/s (10**6 bytes per second)."""
        return self.average_mib_s * MIB / 1e6


def parse_bw(text: str) -> BwResult:
    """The result row of a ``*_bw`` run (``#bytes #iterations peak average msgrate``)."""
    m = _RESULT_RE.search(text)
    if m is None:
        raise ValueError(f"no bandwidth result in perftest output:\n{text}")
    return BwResult(
        msg_bytes=int(m.group(1)),
        iterations=int(m.group(2)),
        peak_mib_s=float(m.group(3)),
        average_mib_s=float(m.group(4)),
        msg_rate_mpps=float(m.group(5)),
    )


def loopback_bw(
    tool: str,
    *,
    log_dir: Path,
    size: int = 65536,
    iterations: int = 200,
    port: int = 18515,
    timeout: float = 300.0,
) -> BwResult:
    """Run ``tool`` (e.g. ``ib_write_bw``) as server and client on rxe0; the client's result.

    perftest calibrates the CPU clock before it reports, and under emulation that calibration
    sometimes fails ("Correlation coefficient r^2 ... < 0.9 / Can't produce a report"): such a
    run is repeated (up to three times); any other failure is raised at once."""
    for attempt in range(3):
        try:
            return _loopback_bw_once(tool, log_dir, size, iterations, port, timeout)
        except CommandError as e:
            if CALIBRATION_FAILED not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


CALIBRATION_FAILED = "Can't produce a report"


def _loopback_bw_once(
    tool: str, log_dir: Path, size: int, iterations: int, port: int, timeout: float
) -> BwResult:
    common = [tool, "-d", RXE_DEVICE, "-R", "-s", str(size), "-n", str(iterations), "-p", str(port)]
    with Background(common, log=log_dir / f"{tool}-server.log") as server:
        server.wait_ready(lambda: rdma_listening(port), timeout=60)
        client = run([*common, testbed_addr()], timeout=timeout)
        (log_dir / f"{tool}-client.log").write_text(client.stdout + client.stderr)
        assert server.proc is not None
        rc = server.proc.wait(timeout)
    if rc != 0:
        raise RuntimeError(f"{tool} server exited {rc}:\n{server.log_tail()}")
    return parse_bw(client.stdout)
