"""A typed ctypes binding of the librdmacm calls the pyverbs provider needs.

pyverbs 44 wraps ``rdma_cm_event`` without exposing the event's identifier, status or read
resources, and hides every descriptor and pointer. So the provider runs connection management
itself through librdmacm's public C interface (``<rdma/rdma_cma.h>``, ABI ``librdmacm.so.1``):
event channels, identifiers, address and route resolution, connect/accept/reject/disconnect
and ``rdma_init_qp_attr``. Every struct read here is read through the header's own definition
from a pointer librdmacm handed out; nothing is found by probing memory.

Queue pairs, completion queues and memory stay with pyverbs (see ``pyverbs_qp``); the two meet
only in the queue pair number (``rdma_conn_param.qp_num``) and the attributes
``rdma_init_qp_attr`` returns for our queue pair's state transitions.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from nfsrdma.transport.rdma.provider import ProviderError

__all__ = [
    "CmError",
    "CmEvent",
    "CmId",
    "ConnParams",
    "EventChannel",
    "EventType",
    "QpAttr",
    "ibv_qp_attr",
    "sockaddr_text",
]

RDMA_PS_TCP = 0x0106


class EventType:
    """``enum rdma_cm_event_type``."""

    ADDR_RESOLVED = 0
    ADDR_ERROR = 1
    ROUTE_RESOLVED = 2
    ROUTE_ERROR = 3
    CONNECT_REQUEST = 4
    CONNECT_RESPONSE = 5
    CONNECT_ERROR = 6
    UNREACHABLE = 7
    REJECTED = 8
    ESTABLISHED = 9
    DISCONNECTED = 10
    DEVICE_REMOVAL = 11
    MULTICAST_JOIN = 12
    MULTICAST_ERROR = 13
    ADDR_CHANGE = 14
    TIMEWAIT_EXIT = 15


class CmError(ProviderError):
    """A librdmacm call failed; ``errno`` says why."""

    def __init__(self, call: str, err: int) -> None:
        super().__init__(f"{call}: {os.strerror(err)} ({errno.errorcode.get(err, err)})")
        self.errno = err


# Structs of <infiniband/verbs.h> and <rdma/rdma_cma.h>, laid out by ctypes with the platform's
# C rules (pointer sizes and alignment included).


class ibv_global_route(ctypes.Structure):
    _fields_ = (
        ("dgid", ctypes.c_uint8 * 16),
        ("flow_label", ctypes.c_uint32),
        ("sgid_index", ctypes.c_uint8),
        ("hop_limit", ctypes.c_uint8),
        ("traffic_class", ctypes.c_uint8),
    )


class ibv_ah_attr(ctypes.Structure):
    _fields_ = (
        ("grh", ibv_global_route),
        ("dlid", ctypes.c_uint16),
        ("sl", ctypes.c_uint8),
        ("src_path_bits", ctypes.c_uint8),
        ("static_rate", ctypes.c_uint8),
        ("is_global", ctypes.c_uint8),
        ("port_num", ctypes.c_uint8),
    )


class ibv_qp_cap(ctypes.Structure):
    _fields_ = (
        ("max_send_wr", ctypes.c_uint32),
        ("max_recv_wr", ctypes.c_uint32),
        ("max_send_sge", ctypes.c_uint32),
        ("max_recv_sge", ctypes.c_uint32),
        ("max_inline_data", ctypes.c_uint32),
    )


class ibv_qp_attr(ctypes.Structure):
    _fields_ = (
        ("qp_state", ctypes.c_int),
        ("cur_qp_state", ctypes.c_int),
        ("path_mtu", ctypes.c_int),
        ("path_mig_state", ctypes.c_int),
        ("qkey", ctypes.c_uint32),
        ("rq_psn", ctypes.c_uint32),
        ("sq_psn", ctypes.c_uint32),
        ("dest_qp_num", ctypes.c_uint32),
        ("qp_access_flags", ctypes.c_uint),
        ("cap", ibv_qp_cap),
        ("ah_attr", ibv_ah_attr),
        ("alt_ah_attr", ibv_ah_attr),
        ("pkey_index", ctypes.c_uint16),
        ("alt_pkey_index", ctypes.c_uint16),
        ("en_sqd_async_notify", ctypes.c_uint8),
        ("sq_draining", ctypes.c_uint8),
        ("max_rd_atomic", ctypes.c_uint8),
        ("max_dest_rd_atomic", ctypes.c_uint8),
        ("min_rnr_timer", ctypes.c_uint8),
        ("port_num", ctypes.c_uint8),
        ("timeout", ctypes.c_uint8),
        ("retry_cnt", ctypes.c_uint8),
        ("rnr_retry", ctypes.c_uint8),
        ("alt_port_num", ctypes.c_uint8),
        ("alt_timeout", ctypes.c_uint8),
        ("rate_limit", ctypes.c_uint32),
    )


class _sockaddr_storage(ctypes.Structure):
    _fields_ = (
        ("family", ctypes.c_uint16),
        ("data", ctypes.c_uint8 * 118),
        ("align", ctypes.c_uint64),
    )


class _rdma_ib_addr(ctypes.Structure):
    _fields_ = (
        ("sgid", ctypes.c_uint8 * 16),
        ("dgid", ctypes.c_uint8 * 16),
        ("pkey", ctypes.c_uint16),
    )


class _rdma_addr(ctypes.Structure):
    _fields_ = (("src", _sockaddr_storage), ("dst", _sockaddr_storage), ("ib", _rdma_ib_addr))


class _rdma_route(ctypes.Structure):
    _fields_ = (("addr", _rdma_addr), ("path_rec", ctypes.c_void_p), ("num_paths", ctypes.c_int))


class _rdma_event_channel(ctypes.Structure):
    _fields_ = (("fd", ctypes.c_int),)


class _rdma_cm_id(ctypes.Structure):
    _fields_ = (
        ("verbs", ctypes.c_void_p),  # struct ibv_context *: its first member is the device
        ("channel", ctypes.POINTER(_rdma_event_channel)),
        ("context", ctypes.c_void_p),
        ("qp", ctypes.c_void_p),
        ("route", _rdma_route),
        ("ps", ctypes.c_int),
        ("port_num", ctypes.c_uint8),
        # event, CQ, SRQ and PD pointers follow; never used here.
    )


class _rdma_conn_param(ctypes.Structure):
    _fields_ = (
        ("private_data", ctypes.c_void_p),
        ("private_data_len", ctypes.c_uint8),
        ("responder_resources", ctypes.c_uint8),
        ("initiator_depth", ctypes.c_uint8),
        ("flow_control", ctypes.c_uint8),
        ("retry_count", ctypes.c_uint8),
        ("rnr_retry_count", ctypes.c_uint8),
        ("srq", ctypes.c_uint8),
        ("qp_num", ctypes.c_uint32),
    )


class _rdma_ud_param(ctypes.Structure):
    _fields_ = (
        ("private_data", ctypes.c_void_p),
        ("private_data_len", ctypes.c_uint8),
        ("ah_attr", ibv_ah_attr),
        ("qp_num", ctypes.c_uint32),
        ("qkey", ctypes.c_uint32),
    )


class _param(ctypes.Union):
    _fields_ = (("conn", _rdma_conn_param), ("ud", _rdma_ud_param))


class _rdma_cm_event(ctypes.Structure):
    _fields_ = (
        ("id", ctypes.POINTER(_rdma_cm_id)),
        ("listen_id", ctypes.POINTER(_rdma_cm_id)),
        ("event", ctypes.c_int),
        ("status", ctypes.c_int),
        ("param", _param),
    )


_ChannelP = ctypes.POINTER(_rdma_event_channel)
_IdP = ctypes.POINTER(_rdma_cm_id)
_EventP = ctypes.POINTER(_rdma_cm_event)


class _Lib:
    """librdmacm (and libibverbs for device names), loaded on first use."""

    def __init__(self) -> None:
        try:
            cm = ctypes.CDLL("librdmacm.so.1", use_errno=True)
            verbs = ctypes.CDLL("libibverbs.so.1", use_errno=True)
        except OSError as exc:
            raise ProviderError(f"librdmacm/libibverbs not available: {exc}") from exc

        def fn(
            lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any
        ) -> ctypes._NamedFuncPointer:
            f: ctypes._NamedFuncPointer = getattr(lib, name)
            f.restype = restype
            f.argtypes = argtypes
            return f

        c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
        self.create_event_channel = fn(cm, "rdma_create_event_channel", _ChannelP)
        self.destroy_event_channel = fn(cm, "rdma_destroy_event_channel", None, _ChannelP)
        self.create_id = fn(
            cm, "rdma_create_id", c_int, _ChannelP, ctypes.POINTER(_IdP), c_void_p, c_int
        )
        self.destroy_id = fn(cm, "rdma_destroy_id", c_int, _IdP)
        self.bind_addr = fn(cm, "rdma_bind_addr", c_int, _IdP, c_void_p)
        self.listen = fn(cm, "rdma_listen", c_int, _IdP, c_int)
        self.resolve_addr = fn(cm, "rdma_resolve_addr", c_int, _IdP, c_void_p, c_void_p, c_int)
        self.resolve_route = fn(cm, "rdma_resolve_route", c_int, _IdP, c_int)
        self.connect = fn(cm, "rdma_connect", c_int, _IdP, ctypes.POINTER(_rdma_conn_param))
        self.accept = fn(cm, "rdma_accept", c_int, _IdP, ctypes.POINTER(_rdma_conn_param))
        self.reject = fn(cm, "rdma_reject", c_int, _IdP, c_void_p, ctypes.c_uint8)
        self.establish = fn(cm, "rdma_establish", c_int, _IdP)
        self.disconnect = fn(cm, "rdma_disconnect", c_int, _IdP)
        self.init_qp_attr = fn(
            cm,
            "rdma_init_qp_attr",
            c_int,
            _IdP,
            ctypes.POINTER(ibv_qp_attr),
            ctypes.POINTER(c_int),
        )
        self.get_cm_event = fn(cm, "rdma_get_cm_event", c_int, _ChannelP, ctypes.POINTER(_EventP))
        self.ack_cm_event = fn(cm, "rdma_ack_cm_event", c_int, _EventP)
        self.event_str = fn(cm, "rdma_event_str", ctypes.c_char_p, c_int)
        self.get_device_name = fn(verbs, "ibv_get_device_name", ctypes.c_char_p, c_void_p)


_lib: _Lib | None = None


def _l() -> _Lib:
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


def _check(call: str, rc: int) -> None:
    if rc != 0:
        raise CmError(call, ctypes.get_errno() or errno.EIO)


def _call(call: str, *args: object) -> None:
    _check(f"rdma_{call}", getattr(_l(), call)(*args))


# Addresses.


def sockaddr(address: str, port: int) -> ctypes.Array[ctypes.c_char]:
    """A ``struct sockaddr_in`` or ``sockaddr_in6`` for a numeric address."""
    try:
        packed = socket.inet_pton(socket.AF_INET, address)
        family = socket.AF_INET
        offset = 4
    except OSError:
        try:
            packed = socket.inet_pton(socket.AF_INET6, address)
        except OSError:
            raise ProviderError(f"not a numeric IP address: {address!r}") from None
        family = socket.AF_INET6
        offset = 8
    raw = bytearray(ctypes.sizeof(_sockaddr_storage))
    raw[0:2] = family.to_bytes(2, sys.byteorder)  # sa_family_t, host order
    raw[2:4] = port.to_bytes(2, "big")
    raw[offset : offset + len(packed)] = packed
    return ctypes.create_string_buffer(bytes(raw), len(raw))


def sockaddr_text(raw: bytes) -> str:
    """``host:port`` of a ``struct sockaddr`` (IPv4 or IPv6), or ``?`` for anything else."""
    if len(raw) < 4:
        return "?"
    family = int.from_bytes(raw[0:2], sys.byteorder)
    port = int.from_bytes(raw[2:4], "big")
    if family == socket.AF_INET and len(raw) >= 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[4:8])}:{port}"
    if family == socket.AF_INET6 and len(raw) >= 24:
        return f"{socket.inet_ntop(socket.AF_INET6, raw[8:24])}:{port}"
    return "?"


# Events.


@dataclass(frozen=True, slots=True)
class CmEvent:
    """One ``struct rdma_cm_event``, copied out before it was acknowledged."""

    type: int
    name: str
    status: int
    id: int  # the rdma_cm_id it is for (a new one for CONNECT_REQUEST)
    listen_id: int  # for CONNECT_REQUEST: the listener's
    private_data: bytes
    responder_resources: int
    initiator_depth: int


def event_name(event_type: int) -> str:
    name = _l().event_str(event_type)
    return name.decode() if name else f"RDMA_CM_EVENT_{event_type}"


def decode_event(raw: _rdma_cm_event) -> CmEvent:
    """Copy what the provider needs out of a C event (valid until it is acknowledged)."""
    conn = raw.param.conn
    data = b""
    if conn.private_data and conn.private_data_len:
        data = ctypes.string_at(conn.private_data, conn.private_data_len)
    return CmEvent(
        type=int(raw.event),
        name=event_name(int(raw.event)),
        status=int(raw.status),
        id=ctypes.cast(raw.id, ctypes.c_void_p).value or 0,
        listen_id=ctypes.cast(raw.listen_id, ctypes.c_void_p).value or 0,
        private_data=data,
        responder_resources=int(conn.responder_resources),
        initiator_depth=int(conn.initiator_depth),
    )


class EventChannel:
    """An rdma_cm event channel with a non-blocking descriptor (for ``loop.add_reader``)."""

    def __init__(self) -> None:
        self._ptr: ctypes._Pointer[_rdma_event_channel] = _l().create_event_channel()
        if not self._ptr:
            raise CmError("rdma_create_event_channel", ctypes.get_errno() or errno.ENODEV)
        fd = self.fd
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    @property
    def fd(self) -> int:
        return int(self._ptr.contents.fd)

    @property
    def pointer(self) -> ctypes._Pointer[_rdma_event_channel]:
        return self._ptr

    def get_event(self) -> CmEvent | None:
        """The next event, acknowledged at once (so ``rdma_destroy_id`` never waits), or None
        when none is queued."""
        event = _EventP()
        if _l().get_cm_event(self._ptr, ctypes.byref(event)) != 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise CmError("rdma_get_cm_event", err or errno.EIO)
        try:
            return decode_event(event.contents)
        finally:
            _l().ack_cm_event(event)

    def close(self) -> None:
        if self._ptr:
            _l().destroy_event_channel(self._ptr)
            self._ptr = _ChannelP()


# Identifiers.


@dataclass(frozen=True, slots=True)
class ConnParams:
    """``struct rdma_conn_param`` for an identifier without a librdmacm queue pair."""

    qp_num: int
    responder_resources: int
    initiator_depth: int
    retry_count: int
    rnr_retry_count: int
    private_data: bytes = b""

    def to_c(self) -> tuple[_rdma_conn_param, ctypes.Array[ctypes.c_char] | None]:
        buf = ctypes.create_string_buffer(self.private_data) if self.private_data else None
        param = _rdma_conn_param(
            private_data=ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None,
            private_data_len=len(self.private_data),
            responder_resources=self.responder_resources,
            initiator_depth=self.initiator_depth,
            flow_control=0,
            retry_count=self.retry_count,
            rnr_retry_count=self.rnr_retry_count,
            srq=0,
            qp_num=self.qp_num,
        )
        return param, buf  # the buffer must outlive the call


class QpAttr:
    """Attributes for one queue pair state transition, from ``rdma_init_qp_attr``."""

    def __init__(self, attr: ibv_qp_attr, mask: int) -> None:
        self.attr = attr
        self.mask = mask


class CmId:
    """An ``rdma_cm_id`` (RDMA_PS_TCP: reliable connected)."""

    def __init__(self, pointer: ctypes._Pointer[_rdma_cm_id]) -> None:
        self._ptr = pointer

    @classmethod
    def create(cls, channel: EventChannel) -> CmId:
        ptr = _IdP()
        _call("create_id", channel.pointer, ctypes.byref(ptr), None, RDMA_PS_TCP)
        return cls(ptr)

    @classmethod
    def adopt(cls, handle: int) -> CmId:
        """The identifier librdmacm made for an incoming connection (``CmEvent.id``)."""
        return cls(ctypes.cast(ctypes.c_void_p(handle), _IdP))

    @property
    def handle(self) -> int:
        return ctypes.cast(self._ptr, ctypes.c_void_p).value or 0

    def _live(self) -> ctypes._Pointer[_rdma_cm_id]:
        """The pointer, refused once destroyed (librdmacm would dereference NULL)."""
        if not self._ptr:
            raise ProviderError("rdma_cm identifier destroyed")
        return self._ptr

    def _id(self) -> _rdma_cm_id:
        return self._live().contents

    @property
    def device_name(self) -> str:
        """The RDMA device the identifier is bound to (after bind or address resolution)."""
        verbs = self._id().verbs
        if not verbs:
            raise ProviderError("rdma_cm identifier not bound to a device")
        device = ctypes.c_void_p.from_address(verbs).value  # ibv_context.device
        name = _l().get_device_name(device)
        return name.decode() if name else "?"

    @property
    def port_num(self) -> int:
        return int(self._id().port_num)

    @property
    def local(self) -> str:
        """``host:port`` of our end (``rdma_get_local_addr``)."""
        return sockaddr_text(bytes(self._id().route.addr.src))

    @property
    def peer(self) -> str:
        """``host:port`` of the remote end (``rdma_get_peer_addr``)."""
        return sockaddr_text(bytes(self._id().route.addr.dst))

    def bind(self, address: str, port: int) -> None:
        addr = sockaddr(address, port)
        _call("bind_addr", self._live(), addr)

    def listen(self, backlog: int) -> None:
        _call("listen", self._live(), backlog)

    def resolve_addr(self, address: str, port: int, timeout_ms: int) -> None:
        addr = sockaddr(address, port)
        _call("resolve_addr", self._live(), None, addr, timeout_ms)

    def resolve_route(self, timeout_ms: int) -> None:
        _call("resolve_route", self._live(), timeout_ms)

    def connect(self, params: ConnParams) -> None:
        param, keep = params.to_c()
        _call("connect", self._live(), ctypes.byref(param))
        del keep

    def accept(self, params: ConnParams) -> None:
        param, keep = params.to_c()
        _call("accept", self._live(), ctypes.byref(param))
        del keep

    def reject(self, private_data: bytes = b"") -> None:
        buf = ctypes.create_string_buffer(private_data) if private_data else None
        _call("reject", self._live(), buf, len(private_data))

    def establish(self) -> None:
        _call("establish", self._live())

    def disconnect(self) -> None:
        _call("disconnect", self._live())

    def init_qp_attr(self, state: int) -> QpAttr:
        attr = ibv_qp_attr()
        attr.qp_state = state
        mask = ctypes.c_int(0)
        _call("init_qp_attr", self._live(), ctypes.byref(attr), ctypes.byref(mask))
        return QpAttr(attr, int(mask.value))

    def destroy(self) -> None:
        if self._ptr:
            ptr, self._ptr = self._ptr, _IdP()
            _check("rdma_destroy_id", _l().destroy_id(ptr))
