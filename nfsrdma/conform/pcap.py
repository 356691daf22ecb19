"""``--trace FILE``: the messages of failing checks as a pcap file Wireshark dissects.

The harness sees messages, not packets, so the packets are made up around them (sans-IO: this
module only builds bytes):

- TCP (``nfs://``): each connection becomes an IPv4 TCP flow, client 10.0.0.1 (a port per
  connection) to the server 10.0.0.2 port 2049, with a three-way handshake, sequence and
  acknowledgement numbers that follow the bytes, and the RPC record marking as sent. Wireshark
  decodes it as RPC and NFS.
- RPC-over-RDMA (``rdma://``): each message becomes one RoCEv2 packet (IPv4, UDP port 4791,
  an InfiniBand base transport header for an RC SEND Only, the message, an ICRC field), queue
  pair numbers per connection and direction, packet sequence numbers counting up. Wireshark's
  InfiniBand dissector hands a SEND's payload to its RPC-over-RDMA dissector (``rpcordma``),
  which decodes the transport header and the RPC message inside.

The link type is LINKTYPE_RAW (101): every packet starts with its IPv4 header."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from nfsrdma.conform.harness import WireRecord

LINKTYPE_RAW = 101
CLIENT, SERVER = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
NFS_PORT, ROCE_PORT = 2049, 4791
MAX_SEGMENT = 60000  # TCP payload per packet (an IPv4 packet holds less than 64 KiB)
BTH_SEND_ONLY = 0x04  # RC SEND Only


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4(src: bytes, dst: bytes, proto: int, payload: bytes, ident: int) -> bytes:
    head = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident & 0xFFFF, 0x4000, 64, proto, 0, src, dst
    )
    head = head[:10] + struct.pack("!H", _checksum(head)) + head[12:]
    return head + payload


def _tcp(
    src: bytes, dst: bytes, sport: int, dport: int, seq: int, ack: int, flags: int, data: bytes
) -> bytes:
    head = struct.pack(
        "!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0
    )
    pseudo = struct.pack("!4s4sBBH", src, dst, 0, 6, len(head) + len(data))
    csum = _checksum(pseudo + head + data)
    return head[:16] + struct.pack("!H", csum) + head[18:] + data


def _udp(sport: int, dport: int, data: bytes) -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data  # checksum 0: none


@dataclass
class _Flow:
    port: int
    seq: dict[bool, int] = field(default_factory=lambda: {True: 1000, False: 5000})
    psn: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    opened: bool = False


class PcapWriter:
    """Packets for ``WireRecord``s of one transport, as a pcap byte string."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.flows: dict[int, _Flow] = {}
        self.packets: list[tuple[float, bytes]] = []
        self._ident = 0

    def _flow(self, conn: int) -> _Flow:
        if conn not in self.flows:
            self.flows[conn] = _Flow(port=40000 + conn % 20000)
        return self.flows[conn]

    def _ip(self, outbound: bool, proto: int, payload: bytes, at: float) -> None:
        self._ident += 1
        src, dst = (CLIENT, SERVER) if outbound else (SERVER, CLIENT)
        self.packets.append((at, _ipv4(src, dst, proto, payload, self._ident)))

    def _tcp_packet(self, f: _Flow, outbound: bool, flags: int, data: bytes, at: float) -> None:
        src, dst = (CLIENT, SERVER) if outbound else (SERVER, CLIENT)
        sport, dport = (f.port, NFS_PORT) if outbound else (NFS_PORT, f.port)
        seg = _tcp(src, dst, sport, dport, f.seq[outbound], f.seq[not outbound], flags, data)
        self._ip(outbound, 6, seg, at)
        f.seq[outbound] += len(data) + (1 if flags & 0x02 else 0)

    def add(self, r: WireRecord) -> None:
        f = self._flow(r.conn)
        if self.transport == "rdma":
            self._roce(f, r)
            return
        if not f.opened:
            f.opened = True
            self._tcp_packet(f, True, 0x02, b"", r.at)  # SYN
            self._tcp_packet(f, False, 0x12, b"", r.at)  # SYN ACK
            self._tcp_packet(f, True, 0x10, b"", r.at)  # ACK
        for i in range(0, len(r.data), MAX_SEGMENT):
            self._tcp_packet(f, r.outbound, 0x18, r.data[i : i + MAX_SEGMENT], r.at)  # PSH ACK

    def _roce(self, f: _Flow, r: WireRecord) -> None:
        pad = -len(r.data) & 3
        dest_qp = (0x100 + r.conn) & 0xFFFFFF
        psn = f.psn[r.outbound]
        f.psn[r.outbound] = (psn + 1) & 0xFFFFFF
        bth = struct.pack("!BBHI", BTH_SEND_ONLY, pad << 4, 0xFFFF, dest_qp)
        bth += struct.pack("!I", psn)
        payload = bth + r.data + bytes(pad) + bytes(4)  # ICRC: not computed
        # Both directions on one UDP port pair, so Wireshark pairs replies with calls.
        port = 0xC000 + r.conn % 0x3FFF
        sport, dport = (port, ROCE_PORT) if r.outbound else (ROCE_PORT, port)
        self._ip(r.outbound, 17, _udp(sport, dport, payload), r.at)

    def pcap(self) -> bytes:
        out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, LINKTYPE_RAW)]
        for at, pkt in self.packets:
            sec = int(at)
            usec = int((at - sec) * 1e6)
            out.append(struct.pack("<IIII", sec, usec, len(pkt), len(pkt)) + pkt)
        return b"".join(out)


def to_pcap(transport: str, records: Iterable[WireRecord]) -> bytes:
    w = PcapWriter(transport)
    for r in records:
        w.add(r)
    return w.pcap()
