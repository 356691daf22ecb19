"""``--trace``: the messages of a check as a pcap file, valid (the pcap header, every packet's
length and IPv4 header checksum) and decoded by tshark: RPC-over-RDMA as RoCEv2 carrying
RPC-over-RDMA carrying NFSv4, TCP as TCP carrying NFSv4."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nfsrdma.conform.pcap import LINKTYPE_RAW, _checksum, to_pcap
from nfsrdma.conform.registry import all_checks, select

from .servers import served
from .test_cli import tshark


def packets(data: bytes) -> list[bytes]:
    magic, major, minor, _, _, snaplen, link = struct.unpack_from("<IHHiIII", data)
    assert (magic, major, minor, link) == (0xA1B2C3D4, 2, 4, LINKTYPE_RAW)
    out, at = [], 24
    while at < len(data):
        _, _, caplen, length = struct.unpack_from("<IIII", data, at)
        assert caplen == length <= snaplen
        pkt = data[at + 16 : at + 16 + caplen]
        assert len(pkt) == caplen and pkt[0] == 0x45
        assert struct.unpack_from("!H", pkt, 2)[0] == len(pkt)
        assert _checksum(pkt[:20]) == 0  # the IPv4 header checksum holds
        out.append(pkt)
        at += 16 + caplen
    return out


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
async def test_a_checks_messages_as_pcap(tmp_path: Path, transport: str) -> None:
    export = tmp_path / "export"
    export.mkdir()
    check = select(all_checks(), ["CONF-OPS-3"], None)[0]
    async with served(export, transport) as (h, _):
        h.begin()
        await check.func(h)
        records = list(h.wire)
        await h.end()
        await h.aclose()
    assert records
    pcap = tmp_path / "trace.pcap"
    pcap.write_bytes(to_pcap(transport, records))
    pkts = packets(pcap.read_bytes())
    text = tshark(pcap)
    assert "V4 Call WRITE" in text and "V4 Call READ" in text, text
    if transport == "rdma":
        assert len(pkts) == len(records)
        proto = tshark(pcap, "-T", "fields", "-e", "frame.protocols")
        assert all("udp:infiniband:rpcordma:rpc" in line for line in proto.split()), proto
    else:
        assert sum(1 for r in records if r.data) <= len(pkts)
        assert "V4 Reply (Call In" in text
