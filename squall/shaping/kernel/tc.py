"""Executes tc steps (:mod:`squall.shaping.planning.tc_diff`) inside one namespace with pyroute2.

A :class:`TcSession` opens two ``NETLINK_ROUTE`` sockets while its thread is inside the namespace
(:mod:`squall.shaping.kernel.netns`) and drives them from the host: pyroute2's ``IPRoute(use_socket=...)`` for
devices, HTB, FIFOs, ingress and u32 filters, and a raw socket for a backend's own leaf qdisc
(:class:`~squall.shaping.planning.ops.LeafQdisc`, such as netem's, whose options pyroute2 cannot
encode): the leaf encodes its options, :class:`RawQdiscSender` frames and sends them
(:mod:`squall.shaping.kernel.netlink`). A session belongs to
the thread that opened it (pyroute2's rule) and lives for one batch of steps.

pyroute2 takes rates in bytes per second and bursts in bytes; the plan's bits per second are
divided here. Errors come back as :class:`ShapingError` naming the node, the verb and the object.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from squall.shaping.base import ShapingError
from squall.shaping.kernel.netlink import NETLINK_ROUTE, change_flags, create_flags, qdisc_message, wait_ack
from squall.shaping.kernel.netns import Namespace
from squall.shaping.planning.ops import (
    INGRESS_HANDLE,
    ClassOp,
    DeviceOp,
    FilterOp,
    Htb,
    Ingress,
    LeafQdisc,
    Pfifo,
    QdiscOp,
    TcOp,
    show_handle,
)
from squall.shaping.planning.tc_diff import TcStep

logger = logging.getLogger(__name__)

# Deleting what is already gone is fine during teardown; these say "not there".
MISSING = {errno.ENOENT, errno.ENODEV, errno.EINVAL}


class TcStepError(ShapingError):
    """A step failed; ``done`` steps before it succeeded (so the caller knows what it now owns)."""

    def __init__(self, message: str, done: int):
        super().__init__(message)
        self.done = done


def describe(op: TcOp) -> str:
    """A short ``tc``-like description for errors and logs."""
    if isinstance(op, DeviceOp):
        return f"device {op.name} ({op.kind})"
    if isinstance(op, QdiscOp):
        return f"qdisc {op.qdisc.kind} {show_handle(op.handle)} parent {show_handle(op.parent)} dev {op.device}"
    if isinstance(op, ClassOp):
        return f"class htb {show_handle(op.classid)} rate {op.rate_bps}bit ceil {op.ceil_bps}bit dev {op.device}"
    where = f"redirect {op.redirect}" if op.redirect else f"flowid {show_handle(op.target or 0)}"
    return f"filter u32 prio {op.prio} parent {show_handle(op.parent)} {where} dev {op.device}"


class RawQdiscSender:
    """Sends a backend's leaf qdiscs as raw ``RTM_NEWQDISC`` requests and reads the ack.

    Framing: :mod:`squall.shaping.kernel.netlink`.
    """

    def __init__(self, sock: socket.socket):
        sock.bind((0, 0))
        sock.settimeout(5.0)
        self._sock = sock
        self._seq = 0

    def send(self, index: int, op: QdiscOp, leaf: LeafQdisc, *, create: bool) -> None:
        """Add (``create``) or change the qdisc ``op`` (holding ``leaf``) on interface ``index``; raise NetlinkError."""
        self._seq += 1
        flags = create_flags() if create else change_flags()
        msg = qdisc_message(index=index, handle=op.handle, parent=op.parent, kind=leaf.kind,
                            options=leaf.options(), flags=flags, seq=self._seq)
        self._sock.send(msg)
        code = wait_ack(self._sock, self._seq)
        if code:
            raise NetlinkError(code, os.strerror(code))


class TcSession:
    """Netlink sockets in one namespace, used from the thread that opened them."""

    def __init__(self, namespace: Namespace, node: int):
        self.node = node
        with namespace.entered():
            route = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
            raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self._raw = raw
        self._leaves = RawQdiscSender(raw)
        try:
            self._ipr = IPRoute(use_socket=route)
        except BaseException:
            route.close()
            raw.close()
            raise
        self._index: dict[str, int] = {}

    def __enter__(self) -> TcSession:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close both sockets."""
        self._ipr.close()
        self._raw.close()

    # -- running steps ----------------------------------------------------------------------------
    def run(self, steps: Sequence[TcStep], *, missing_ok: bool = False) -> None:
        """Execute ``steps`` in order; with ``missing_ok``, deleting what is not there is no error."""
        for done, step in enumerate(steps):
            try:
                self._one(step)
            except (NetlinkError, OSError) as exc:
                code = exc.code if isinstance(exc, NetlinkError) else (exc.errno or 0)
                if missing_ok and step.verb == "delete" and code in MISSING:
                    continue
                raise TcStepError(
                    f"node {self.node}: tc {step.verb} {describe(step.op)}: {os.strerror(code) if code else exc}",
                    done,
                ) from exc

    def _one(self, step: TcStep) -> None:
        op = step.op
        if isinstance(op, DeviceOp):
            self._device(step.verb, op)
        elif isinstance(op, QdiscOp):
            self._qdisc(step.verb, op)
        elif isinstance(op, ClassOp):
            self._class(step.verb, op)
        else:
            self._filter(step.verb, op)

    def index(self, device: str) -> int:
        """Interface index of ``device`` in this namespace."""
        if device not in self._index:
            found = self._ipr.link_lookup(ifname=device)
            if not found:
                raise OSError(errno.ENODEV, f"no device {device}")
            self._index[device] = int(found[0])
        return self._index[device]

    # -- objects ----------------------------------------------------------------------------------
    def _device(self, verb: str, op: DeviceOp) -> None:
        if verb == "add":
            self._ipr.link("add", ifname=op.name, kind=op.kind)
            self._ipr.link("set", index=self.index(op.name), state="up")
        elif verb == "delete":
            self._ipr.link("del", index=self.index(op.name))
            self._index.pop(op.name, None)
        else:
            raise ValueError(f"a device cannot be changed: {op}")

    def _qdisc(self, verb: str, op: QdiscOp) -> None:
        index = self.index(op.device)
        qdisc = op.qdisc
        if verb == "delete":
            # Always name the kind: without one pyroute2 rewrites the parent to the root.
            self._ipr.tc("del", qdisc.kind, index, handle=op.handle, parent=op.parent)
            return
        command = "add" if verb == "add" else "change"
        if isinstance(qdisc, Htb):
            self._ipr.tc(command, "htb", index, handle=op.handle, parent=op.parent, default=qdisc.default_minor)
        elif isinstance(qdisc, Pfifo):
            self._ipr.tc(command, "pfifo", index, handle=op.handle, parent=op.parent, limit=qdisc.limit)
        elif isinstance(qdisc, Ingress):
            if verb == "add":
                self._ipr.tc("add", "ingress", index)
        else:
            self._leaves.send(index, op, qdisc, create=verb == "add")

    def _class(self, verb: str, op: ClassOp) -> None:
        index = self.index(op.device)
        if verb == "delete":
            # pyroute2 builds HTB class options even for a delete, and fails without rates
            self._ipr.tc("del-class", "htb", index, **_class_args(op))
            return
        command = "add-class" if verb == "add" else "change-class"
        self._ipr.tc(command, "htb", index, **_class_args(op))

    def _filter(self, verb: str, op: FilterOp) -> None:
        index = self.index(op.device)
        args: dict[str, Any] = {"parent": op.parent, "prio": op.prio, "protocol": op.protocol}
        match = op.match
        keys = [f"0x{match.value:08x}/0x{match.mask:08x}+{match.offset}"] if match else ["0x0/0x0+0"]
        if verb == "delete":
            # pyroute2 builds u32 options even for a delete; the kernel deletes by priority.
            self._ipr.tc("del-filter", "u32", index, target=0, keys=keys, **args)
            return
        if verb != "add":
            raise ValueError(f"a filter cannot be changed: {op}")
        if op.redirect is not None:
            action = {"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": self.index(op.redirect)}
            # u32 insists on a class id; on the ingress qdisc it means nothing.
            self._ipr.tc("add-filter", "u32", index, target=INGRESS_HANDLE | 1, keys=keys, action=action, **args)
        else:
            self._ipr.tc("add-filter", "u32", index, target=op.target, keys=keys, **args)

def _class_args(op: ClassOp) -> dict[str, Any]:
    return {
        "handle": op.classid,
        "parent": op.parent,
        "rate": max(1, op.rate_bps // 8),
        "ceil": max(1, op.ceil_bps // 8),
        "burst": op.burst_bytes,
        "cburst": op.cburst_bytes,
        "quantum": op.quantum_bytes,
    }


def run_steps(namespace: Namespace, node: int, steps: Sequence[TcStep], *, missing_ok: bool = False) -> None:
    """Open a session in ``namespace``, run ``steps``, close it."""
    if not steps:
        return
    with TcSession(namespace, node) as session:
        session.run(steps, missing_ok=missing_ok)
    logger.debug("node %d: %d tc steps", node, len(steps))
