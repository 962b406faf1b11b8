"""A minimal nfnetlink_queue client: raw ``AF_NETLINK`` socket plus struct packing.

Wire format (``linux/netfilter/nfnetlink_queue.h``). Netlink headers and attribute headers are in
host byte order; everything inside the nfnetlink payload is big endian::

    nlmsghdr  len u32 | type u16 | flags u16 | seq u32 | portid u32            (16 bytes, host)
    nfgenmsg  family u8 | version u8 (0) | res_id be16 = queue number         (4 bytes)
    nlattr    len u16 | type u16 (host), payload padded to 4 bytes

    type = NFNL_SUBSYS_QUEUE (3) << 8 | PACKET 0 / VERDICT 1 / CONFIG 2 / VERDICT_BATCH 3

A packet message always starts with ``NFQA_PACKET_HDR {be32 id, be16 hw_protocol, u8 hook}`` at
offset 20, so the fast path reads queue number and packet id with one ``unpack_from`` at offset 18
and walks no attributes. A verdict is 32 bytes: header, nfgenmsg, ``NFQA_VERDICT_HDR {be32
verdict, be32 id}``. ``VERDICT_BATCH`` has the same layout and applies to every packet of that
queue still waiting with an id up to (serial arithmetic) the given one. Many verdicts, also for
different queues, are concatenated into one datagram; the kernel processes them in order and
answers only errors (no ``NLM_F_ACK``), which come back as ``NLMSG_ERROR`` messages on the same
socket and are counted.

One socket serves every queue of one namespace: a netlink socket belongs to the namespace it
was *created* in (see :mod:`.netns`) and one port id may bind many queue numbers, so the daemon
needs one file descriptor per namespace, not per peer.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Callable
from typing import Final

from squall.shaping.kernel.netlink import NETLINK_NETFILTER, NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR, attr

from .errors import NetlinkError

SOL_NETLINK: Final = 270
NETLINK_NO_ENOBUFS: Final = 5
SO_RCVBUFFORCE: Final = 33
SO_SNDBUFFORCE: Final = 32


NFNL_SUBSYS_QUEUE: Final = 3
MSG_PACKET: Final = NFNL_SUBSYS_QUEUE << 8 | 0
MSG_VERDICT: Final = NFNL_SUBSYS_QUEUE << 8 | 1
MSG_CONFIG: Final = NFNL_SUBSYS_QUEUE << 8 | 2
MSG_VERDICT_BATCH: Final = NFNL_SUBSYS_QUEUE << 8 | 3

NFQA_PACKET_HDR: Final = 1
NFQA_VERDICT_HDR: Final = 2
NFQA_PAYLOAD: Final = 10
NFQA_CAP_LEN: Final = 13

NFQA_CFG_CMD: Final = 1
NFQA_CFG_PARAMS: Final = 2
NFQA_CFG_QUEUE_MAXLEN: Final = 3
NFQA_CFG_MASK: Final = 4
NFQA_CFG_FLAGS: Final = 5
CMD_BIND: Final = 1
CMD_UNBIND: Final = 2
COPY_META: Final = 1
COPY_PACKET: Final = 2
FLAG_FAIL_OPEN: Final = 1
FLAG_GSO: Final = 4

NF_DROP: Final = 0
NF_ACCEPT: Final = 1

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("!BBH")
_NLATTR = struct.Struct("=HH")
_HEAD = struct.Struct("=IH")  # nlmsg_len, nlmsg_type
# res_id, then NFQA_PACKET_HDR's nlattr (len, type read big endian), then the packet id
_PACKET_FAST = struct.Struct("!HHHI")
_PACKET_HDR_TYPE_BE: Final = struct.unpack("!H", struct.pack("=H", NFQA_PACKET_HDR))[0]
_VERDICT_BODY = struct.Struct("!II")
_ERRNO = struct.Struct("=i")
VERDICT_SIZE: Final = 32
MAX_SEND: Final = 64 * 1024  # bytes per datagram, well under the socket's send buffer


def message(kind: int, queue: int, payload: bytes, *, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    """A complete nfnetlink message for ``queue`` with attributes ``payload``."""
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + payload
    return _NLMSGHDR.pack(16 + len(body), kind, flags, seq, 0) + body


def verdict_prefix(queue: int, batch: bool) -> bytes:
    """The first 24 bytes of every (batch) verdict for ``queue``; append ``!II`` verdict, id."""
    kind = MSG_VERDICT_BATCH if batch else MSG_VERDICT
    return (
        _NLMSGHDR.pack(VERDICT_SIZE, kind, NLM_F_REQUEST, 0, 0)
        + _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue)
        + _NLATTR.pack(12, NFQA_VERDICT_HDR)
    )


pack_verdict_body: Callable[[int, int], bytes] = _VERDICT_BODY.pack


def config_requests(queue: int, *, maxlen: int, fail_open: bool, copy_mode: int = COPY_META) -> list[bytes]:
    """Attribute payloads of the CONFIG messages that bind and set up one queue, in order."""
    flags = FLAG_GSO | (FLAG_FAIL_OPEN if fail_open else 0)
    return [
        attr(NFQA_CFG_CMD, struct.pack("!BBH", CMD_BIND, 0, 0)),
        attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0xFFFF, copy_mode)),
        attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen)),
        attr(NFQA_CFG_MASK, struct.pack("!I", FLAG_GSO | FLAG_FAIL_OPEN))
        + attr(NFQA_CFG_FLAGS, struct.pack("!I", flags)),
    ]


def unbind_request() -> bytes:
    """Attribute payload of the CONFIG message that unbinds a queue."""
    return attr(NFQA_CFG_CMD, struct.pack("!BBH", CMD_UNBIND, 0, 0))


def parse_datagram(buf: bytes | bytearray | memoryview, size: int, packets: list[tuple[int, int]]) -> int:
    """Append ``(queue, packet_id)`` for each packet message in ``buf[:size]``; return error count.

    Errors are ``NLMSG_ERROR`` answers with a non-zero code, e.g. ``ENOENT`` for a verdict on a
    packet the kernel no longer holds.
    """
    errors = 0
    off = 0
    while off + 16 <= size:
        length, kind = _HEAD.unpack_from(buf, off)
        if length < 16:
            break
        if kind == MSG_PACKET:
            queue, _, attr_type, pid = _PACKET_FAST.unpack_from(buf, off + 18)
            if attr_type == _PACKET_HDR_TYPE_BE:
                packets.append((queue, pid))
        elif kind == NLMSG_ERROR and _ERRNO.unpack_from(buf, off + 16)[0] != 0:
            errors += 1
        off += (length + 3) & ~3
    return errors


class QueueSocket:
    """One netlink socket (in the namespace where it was created) bound to one or more queues."""

    def __init__(self, sock: socket.socket, *, rcvbuf: int):
        self.sock = sock
        self._seq = 0
        self._stash: list[tuple[int, int]] = []  # packets read while waiting for an ack
        self._stash_errors = 0
        self._buf = bytearray(256 * 1024)
        sock.bind((0, 0))
        _force_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, rcvbuf)
        _force_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, 4 * MAX_SEND)
        sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        sock.setblocking(False)

    @classmethod
    def open(cls, *, rcvbuf: int) -> QueueSocket:
        """A new socket in the calling thread's current network namespace."""
        return cls(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER), rcvbuf=rcvbuf)

    def fileno(self) -> int:
        """The socket's file descriptor, for epoll."""
        return self.sock.fileno()

    def bind_queue(self, queue: int, *, maxlen: int, fail_open: bool) -> None:
        """Bind ``queue`` to this socket (``EBUSY``: another process holds it) and configure it."""
        for payload in config_requests(queue, maxlen=maxlen, fail_open=fail_open):
            self._request(queue, payload)

    def unbind_queue(self, queue: int) -> None:
        """Unbind ``queue``; the kernel drops what is still queued, so release it first."""
        self._request(queue, unbind_request())

    def _request(self, queue: int, payload: bytes, timeout_s: float = 5.0) -> None:
        self._seq += 1
        seq = self._seq
        self.sock.send(message(MSG_CONFIG, queue, payload, flags=NLM_F_REQUEST | NLM_F_ACK, seq=seq))
        self.sock.settimeout(timeout_s)
        try:
            while True:
                size = self.sock.recv_into(self._buf)
                code = self._ack_code(size, seq)
                if code is not None:
                    if code:
                        raise NetlinkError(-code, f"nfqueue config of queue {queue}: {os.strerror(-code)}")
                    return
        finally:
            self.sock.setblocking(False)

    def _ack_code(self, size: int, seq: int) -> int | None:
        """The error code if the datagram holds the ack for ``seq``; stash packets read meanwhile."""
        off = 0
        buf = self._buf
        code = None
        while off + 16 <= size:
            length, kind, _, msg_seq, _ = _NLMSGHDR.unpack_from(buf, off)
            if length < 16:
                break
            if kind == NLMSG_ERROR and msg_seq == seq:
                code = _ERRNO.unpack_from(buf, off + 16)[0]
            off += (length + 3) & ~3
        if code is None:
            self._stash_errors += parse_datagram(buf, size, self._stash)
        return code

    def read_packets(self, packets: list[tuple[int, int]], limit: int) -> tuple[int, int, bool]:
        """Read up to ``limit`` datagrams without blocking; append ``(queue, id)`` to ``packets``.

        :returns: (datagrams read, error answers seen, whether the socket is now empty).
        """
        errors = 0
        if self._stash:
            packets.extend(self._stash)
            self._stash.clear()
            errors, self._stash_errors = self._stash_errors, 0
        recv_into = self.sock.recv_into
        buf = self._buf
        n = 0
        while n < limit:
            try:
                size = recv_into(buf)
            except BlockingIOError:
                return n, errors, True
            n += 1
            errors += parse_datagram(buf, size, packets)
        return n, errors, False

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Send concatenated verdicts, split into datagrams of whole messages."""
        view = memoryview(data)
        step = MAX_SEND - MAX_SEND % VERDICT_SIZE
        for start in range(0, len(view), step):
            chunk = view[start : start + step]
            while True:
                try:
                    self.sock.send(chunk)
                    break
                except BlockingIOError:
                    os.sched_yield()
                except OSError as exc:
                    if exc.errno != errno.EINTR:
                        raise

    def close(self) -> None:
        """Close the socket (the kernel unbinds its queues and drops what they still hold)."""
        self.sock.close()


def _force_buffer(sock: socket.socket, forced: int, plain: int, size: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, forced, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)
