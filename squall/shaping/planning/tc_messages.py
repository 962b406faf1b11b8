"""In-place tc changes encoded as rtnetlink messages ahead of time (pure): a change's bytes, no socket.

A scheduled change (:mod:`squall.shaping.planning.changes`) must cost nothing but a send at its due time, so every
``change`` step of it is encoded here beforehand, against the interface index it will be sent to:

* an HTB class (``RTM_NEWTCLASS``, ``TCA_HTB_PARMS`` and, above 2^32-1 bytes/s, the 64-bit rates);
  its burst is given as the kernel takes it, the time to send ``burst`` bytes at the class's rate
  in 64 ns scheduler ticks (``PSCHED_SHIFT``), with an Ethernet link layer so no rate table is needed;
* a FIFO leaf (``tc_fifo_qopt``), an HTB root (``tc_htb_glob``), a backend's own leaf (its
  :meth:`~squall.shaping.planning.ops.LeafQdisc.options`, e.g. netem's): ``RTM_NEWQDISC`` without
  ``NLM_F_CREATE``, which replaces the qdisc's spec and keeps the packets it holds.

Only ``change`` is encoded: adding or deleting objects is never scheduled (it would drop what a
deleted qdisc holds and reset the TCP flows through it). Every message is sent with sequence number
0 and ``NLM_F_ACK``; the sender numbers them (:func:`with_seq`).
"""

from __future__ import annotations

import struct
from typing import Final

from squall.shaping.base import ShapingError
from squall.shaping.kernel.netlink import NLMSGHDR, TCA_KIND, TCA_OPTIONS, attr, change_flags, qdisc_message
from squall.shaping.planning.ops import ClassOp, Htb, Ingress, LeafQdisc, Pfifo, QdiscOp
from squall.shaping.planning.tc_diff import TcStep

RTM_NEWTCLASS: Final = 40
TCA_HTB_PARMS: Final = 1
TCA_HTB_INIT: Final = 2
TCA_HTB_RATE64: Final = 6
TCA_HTB_CEIL64: Final = 7
TC_LINKLAYER_ETHERNET: Final = 1
PSCHED_TICK_NS: Final = 64  # the kernel's scheduler tick: 1 << PSCHED_SHIFT nanoseconds
HTB_VERSION: Final = 3
HTB_RATE2QUANTUM: Final = 10
U32_MAX: Final = 0xFFFFFFFF

_TCMSG: Final = struct.Struct("=BBHiIII")
_RATESPEC: Final = struct.Struct("=BBHhHI")  # cell_log, linklayer, overhead, cell_align, mpu, rate (bytes/s)
_HTB_OPT_TAIL: Final = struct.Struct("=IIIII")  # buffer, cbuffer (ticks), quantum, level, prio
_HTB_GLOB: Final = struct.Struct("=IIIII")  # version, rate2quantum, defcls, debug, direct_pkts
_U32: Final = struct.Struct("=I")
_U64: Final = struct.Struct("=Q")


def burst_ticks(burst_bytes: int, rate_bytes_per_s: int) -> int:
    """Time to send ``burst_bytes`` at the rate, in scheduler ticks (what ``tc_htb_opt.buffer`` holds)."""
    return min(U32_MAX, burst_bytes * 1_000_000_000 // (max(1, rate_bytes_per_s) * PSCHED_TICK_NS))


def _ratespec(rate_bytes: int) -> bytes:
    return _RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(rate_bytes, U32_MAX))


def htb_class_options(op: ClassOp) -> bytes:
    """``TCA_OPTIONS`` of an HTB class: its parameters, and the 64-bit rates when they do not fit 32 bits."""
    rate, ceil = max(1, op.rate_bps // 8), max(1, op.ceil_bps // 8)
    opt = _ratespec(rate) + _ratespec(ceil) + _HTB_OPT_TAIL.pack(
        burst_ticks(op.burst_bytes, rate), burst_ticks(op.cburst_bytes, ceil), op.quantum_bytes, 0, 0)
    options = attr(TCA_HTB_PARMS, opt)
    if rate > U32_MAX:
        options += attr(TCA_HTB_RATE64, _U64.pack(rate))
    if ceil > U32_MAX:
        options += attr(TCA_HTB_CEIL64, _U64.pack(ceil))
    return options


def class_message(index: int, op: ClassOp) -> bytes:
    """A whole ``RTM_NEWTCLASS`` change request for the HTB class ``op`` on interface ``index``."""
    body = _TCMSG.pack(0, 0, 0, index, op.classid, op.parent, 0)
    body += attr(TCA_KIND, b"htb\0") + attr(TCA_OPTIONS, htb_class_options(op))
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTCLASS, change_flags(), 0, 0) + body


def qdisc_options(op: QdiscOp) -> tuple[str, bytes]:
    """(kind, ``TCA_OPTIONS``) of a qdisc that can be changed in place."""
    qdisc = op.qdisc
    if isinstance(qdisc, Pfifo):
        return "pfifo", _U32.pack(qdisc.limit)
    if isinstance(qdisc, Htb):
        return "htb", attr(TCA_HTB_INIT, _HTB_GLOB.pack(HTB_VERSION, HTB_RATE2QUANTUM, qdisc.default_minor, 0, 0))
    if isinstance(qdisc, Ingress):
        raise ShapingError("the ingress qdisc has nothing to change")
    if isinstance(qdisc, LeafQdisc):
        return qdisc.kind, qdisc.options()
    raise ShapingError(f"no in-place change for a {type(qdisc).__name__} qdisc")


def change_message(step: TcStep, index: int) -> bytes:
    """One ``change`` step as a netlink request to interface ``index`` (sequence number 0).

    :raises ShapingError: for anything but a change of a class or a qdisc.
    """
    if step.verb != "change":
        raise ShapingError(f"only changes are sent in place, not {step.verb} of {step.op}")
    op = step.op
    if isinstance(op, ClassOp):
        return class_message(index, op)
    if isinstance(op, QdiscOp):
        kind, options = qdisc_options(op)
        return qdisc_message(index=index, handle=op.handle, parent=op.parent, kind=kind, options=options,
                             flags=change_flags(), seq=0)
    raise ShapingError(f"no in-place change for {type(op).__name__}")


def with_seq(message: bytes, seq: int) -> bytes:
    """The message with its sequence number set (the header's fourth field)."""
    return message[:8] + _U32.pack(seq & U32_MAX) + message[12:]


def split(batch: bytes) -> list[bytes]:
    """The messages of a concatenated batch, by their header lengths (each padded to 4 bytes)."""
    found: list[bytes] = []
    offset = 0
    while offset + NLMSGHDR.size <= len(batch):
        length = NLMSGHDR.unpack_from(batch, offset)[0]
        if length < NLMSGHDR.size or offset + length > len(batch):
            raise ShapingError(f"a malformed netlink batch: a message of {length} bytes at offset {offset}")
        found.append(batch[offset:offset + length])
        offset += (length + 3) & ~3
    if offset != len(batch):
        raise ShapingError(f"a netlink batch ends with {len(batch) - offset} stray bytes")
    return found
