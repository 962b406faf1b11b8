"""Netlink framing and acks on a live socket, shared by every sender: headers, attributes, acks.

A netlink message is a 16-byte ``nlmsghdr`` (length, type, flags, sequence, port id) and a body;
a body's attributes are ``(length u16, type u16, payload)`` padded to 4 bytes. A request sent with
``NLM_F_ACK`` is answered by an ``NLMSG_ERROR`` message carrying the request's sequence number and
an errno (0: done). Here only the framing: what a qdisc's options or a netfilter request say is
the business of its sender (:mod:`squall.shaping.kernel.tc`, :mod:`squall.shaping.kernel.nft_table`, a
backend's own encoder); the in-place tc changes a run schedules are built ahead of time, with no
socket, in :mod:`squall.shaping.planning.tc_messages`.
"""

from __future__ import annotations

import socket
import struct
from typing import Final

NETLINK_ROUTE: Final = 0
NETLINK_NETFILTER: Final = 12
NLMSG_ERROR: Final = 2
NLM_F_REQUEST: Final = 0x1
NLM_F_ACK: Final = 0x4
NLM_F_EXCL: Final = 0x200
NLM_F_CREATE: Final = 0x400
RTM_NEWQDISC: Final = 36
TCA_KIND: Final = 1
TCA_OPTIONS: Final = 2

NLMSGHDR: Final = struct.Struct("=IHHII")
_TCMSG: Final = struct.Struct("=BBHiIII")
_NLATTR: Final = struct.Struct("=HH")
_ERRNO: Final = struct.Struct("=i")


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def qdisc_message(*, index: int, handle: int, parent: int, kind: str, options: bytes, flags: int, seq: int) -> bytes:
    """A whole ``RTM_NEWQDISC`` request: ``tcmsg``, ``TCA_KIND`` and ``TCA_OPTIONS`` holding ``options``."""
    body = _TCMSG.pack(0, 0, 0, index, handle, parent, 0)
    body += attr(TCA_KIND, kind.encode() + b"\0") + attr(TCA_OPTIONS, options)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWQDISC, flags, seq, 0) + body


def create_flags() -> int:
    """Flags of an ``add`` (fails if the qdisc exists)."""
    return NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL


def change_flags() -> int:
    """Flags of a ``change`` (the qdisc must exist; its whole spec is replaced)."""
    return NLM_F_REQUEST | NLM_F_ACK


def wait_ack(sock: socket.socket, seq: int) -> int:
    """Read ``sock`` until the ack of request ``seq`` arrives; return its errno (0: done, else positive).

    Other messages (acks of earlier requests, a batch's other parts) are skipped.
    """
    while True:
        data = sock.recv(65536)
        off = 0
        while off + NLMSGHDR.size <= len(data):
            length, kind, _, msg_seq, _ = NLMSGHDR.unpack_from(data, off)
            if kind == NLMSG_ERROR and msg_seq == seq and off + NLMSGHDR.size + _ERRNO.size <= len(data):
                return -int(_ERRNO.unpack_from(data, off + NLMSGHDR.size)[0])
            off += max(NLMSGHDR.size, (length + 3) & ~3)
