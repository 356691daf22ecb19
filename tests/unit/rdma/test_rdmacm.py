"""The librdmacm binding, checked on the host (no RDMA device): the C layouts it reads, the
events it copies out, the addresses it builds and reads back."""

from __future__ import annotations

import ctypes

import pytest

from nfsrdma.transport.rdma import rdmacm
from nfsrdma.transport.rdma.provider import ProviderError


def test_layouts_match_the_lp64_headers() -> None:
    """Offsets of <rdma/rdma_cma.h> and <infiniband/verbs.h> on LP64 (x86-64, arm64)."""
    assert rdmacm._rdma_cm_event.param.offset == 24  # two pointers, event, status
    assert rdmacm._rdma_conn_param.qp_num.offset == 16
    assert rdmacm._rdma_cm_id.route.offset == 32  # verbs, channel, context, qp
    assert rdmacm._rdma_addr.dst.offset == 128  # after a sockaddr_storage
    assert rdmacm._rdma_cm_id.port_num.offset == 32 + ctypes.sizeof(rdmacm._rdma_route) + 4
    assert ctypes.sizeof(rdmacm.ibv_ah_attr) == 32
    assert rdmacm.ibv_qp_attr.ah_attr.offset == 56
    assert rdmacm.ibv_qp_attr.pkey_index.offset == 120
    assert rdmacm.ibv_qp_attr.alt_timeout.offset == 134


def test_an_event_is_copied_out_with_its_private_data_and_read_resources() -> None:
    data = ctypes.create_string_buffer(b"\xf6\xab\x0e\x18\x01\x01\x03\x03" + bytes(48), 56)
    ident, listener = rdmacm._rdma_cm_id(), rdmacm._rdma_cm_id()
    raw = rdmacm._rdma_cm_event()
    raw.id = ctypes.pointer(ident)
    raw.listen_id = ctypes.pointer(listener)
    raw.event = rdmacm.EventType.CONNECT_REQUEST
    raw.status = 0
    raw.param.conn.private_data = ctypes.cast(data, ctypes.c_void_p)
    raw.param.conn.private_data_len = 56
    raw.param.conn.responder_resources = 0
    raw.param.conn.initiator_depth = 4
    event = rdmacm.decode_event(raw)
    assert event.type == rdmacm.EventType.CONNECT_REQUEST
    assert event.name == "RDMA_CM_EVENT_CONNECT_REQUEST"  # librdmacm's own name
    assert event.id == ctypes.addressof(ident) and event.listen_id == ctypes.addressof(listener)
    assert event.private_data == data.raw
    assert (event.responder_resources, event.initiator_depth) == (0, 4)
    raw.event, raw.status = rdmacm.EventType.REJECTED, 28
    raw.param.conn.private_data = None
    rejected = rdmacm.decode_event(raw)
    assert (rejected.status, rejected.private_data) == (28, b"")


@pytest.mark.parametrize(
    ("address", "port", "text"),
    [("192.0.2.7", 20049, "192.0.2.7:20049"), ("fe80::1", 40001, "fe80::1:40001")],
)
def test_addresses_round_trip_and_name_the_peer(address: str, port: int, text: str) -> None:
    raw = bytes(rdmacm.sockaddr(address, port))
    assert rdmacm.sockaddr_text(raw) == text
    ident = rdmacm._rdma_cm_id()
    ctypes.memmove(ctypes.addressof(ident.route.addr.dst), raw, len(raw))
    cmid = rdmacm.CmId.adopt(ctypes.addressof(ident))
    assert cmid.peer == text  # rdma_get_peer_addr: route.addr.dst_addr
    assert cmid.local == "?"  # nothing bound


def test_bad_input_is_refused_not_dereferenced() -> None:
    with pytest.raises(ProviderError, match="numeric"):
        rdmacm.sockaddr("server.example", 1)
    ident = rdmacm._rdma_cm_id()
    cmid = rdmacm.CmId.adopt(ctypes.addressof(ident))
    with pytest.raises(ProviderError, match="not bound"):
        _ = cmid.device_name  # verbs is NULL
    dead = rdmacm.CmId.adopt(0)
    with pytest.raises(ProviderError, match="destroyed"):
        dead.disconnect()
    with pytest.raises(ProviderError, match="destroyed"):
        _ = dead.peer
