"""Finding RDMA devices and the IP addresses rdma_cm reaches them by (Linux sysfs)."""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys/class/infiniband")
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True, slots=True)
class RdmaDeviceInfo:
    name: str  # e.g. "rxe0", "mlx5_0"
    netdevs: tuple[str, ...]  # the network interfaces under it (RoCE / iWARP)
    addresses: tuple[str, ...]  # their IPv4 addresses

    @property
    def address(self) -> str | None:
        return self.addresses[0] if self.addresses else None


def ipv4_address(ifname: str) -> str | None:
    """The interface's primary IPv4 address, or None."""
    packed = struct.pack("256s", ifname.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, packed)
        except OSError:
            return None
    return socket.inet_ntoa(res[20:24])


def list_devices(sysfs: Path = SYSFS) -> list[RdmaDeviceInfo]:
    """Every RDMA device with its network interfaces and their IPv4 addresses."""
    if not sysfs.is_dir():
        return []
    out = []
    for dev in sorted(sysfs.iterdir()):
        netdevs: list[str] = []
        for ndev in sorted(dev.glob("ports/*/gid_attrs/ndevs/*")):
            try:
                name = ndev.read_text().strip()
            except OSError:
                continue
            if name and name not in netdevs:
                netdevs.append(name)
        addrs = tuple(a for a in (ipv4_address(n) for n in netdevs) if a)
        out.append(RdmaDeviceInfo(dev.name, tuple(netdevs), addrs))
    return out


def find_address(device: str | None = None, bind: str | None = None) -> tuple[str, str] | None:
    """(device name, address) to listen on: the named device, the device owning ``bind``, or
    the first device that has an IPv4 address. None when there is no usable device."""
    for info in list_devices():
        if device is not None and info.name != device:
            continue
        if bind not in (None, "", "0.0.0.0"):
            if bind in info.addresses:
                return info.name, bind
            continue
        if info.address is not None:
            return info.name, info.address
    return None
