"""Does this kernel take a qdisc? Ask it: add one in a scratch namespace.

:func:`probe_leaf` runs on a thread of its own that ``unshare(CLONE_NEWNET)``s into a brand-new,
unnamed namespace, creates a veth pair there, sends the same raw ``RTM_NEWQDISC`` request the tc
executor would send for a backend's leaf qdisc (:class:`~squall.shaping.kernel.tc.RawQdiscSender`), then goes back to
the host namespace. The scratch namespace has no name and no other user, so it disappears as soon
as the thread's sockets are closed: nothing is created in ``/var/run/netns`` and nothing can be
left behind, even on an error. The answer says why the qdisc is missing (no such qdisc, not root,
...). The netem backend asks it about netem (:func:`squall.shaping.select.netem_probe`);
:func:`in_scratch_namespace` serves other kernel checks (:mod:`squall.shaping.capabilities.features`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pyroute2 import IPRoute

from squall.shaping.kernel.netlink import NETLINK_ROUTE
from squall.shaping.kernel.netns import CLONE_NEWNET
from squall.shaping.kernel.tc import RawQdiscSender
from squall.shaping.planning.ops import TC_H_ROOT, LeafQdisc, QdiscOp, handle

logger = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult:
    """Whether a qdisc works here, and why not."""

    available: bool  # the qdisc could be added
    reason: str  # what happened, for logs and errors


def probe_leaf(leaf: LeafQdisc, *, name: str) -> ProbeResult:
    """Whether this kernel adds ``leaf`` (see the module docstring); ``name`` names the probe's thread."""
    result = in_scratch_namespace(lambda: _try_leaf(leaf), lambda why: ProbeResult(False, why), name=name)
    return result if result is not None else ProbeResult(False, "the probe thread died")


def in_scratch_namespace(work: Callable[[], T], refused: Callable[[str], T], *, name: str) -> T | None:
    r"""``work()`` on a thread of its own inside a brand-new, unnamed network namespace.

    The thread ``unshare``\ s into the namespace, runs ``work`` and goes back home; the namespace
    disappears with the thread's sockets, so nothing can be left behind. ``refused(why)`` is the
    answer when no namespace can be made (not root, ...); None when the thread died.
    """
    box: list[T] = []

    def run() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.unshare(CLONE_NEWNET) != 0:
                box.append(refused(f"cannot create a scratch network namespace: {os.strerror(ctypes.get_errno())}"))
                return
            try:
                box.append(work())
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - never refused
                    logger.error("%s: cannot return to the host namespace", name)
        finally:
            os.close(home)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    return box[0] if box else None


def _try_leaf(leaf: LeafQdisc) -> ProbeResult:
    route = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        with IPRoute(use_socket=route) as ipr:
            ipr.link("add", ifname="sqprobe0", kind="veth", peer="sqprobe1")
            index = int(ipr.link_lookup(ifname="sqprobe0")[0])
            RawQdiscSender(raw).send(index, QdiscOp("sqprobe0", TC_H_ROOT, handle(1), leaf), leaf, create=True)
            return ProbeResult(True, f"added a {leaf.kind} qdisc in a scratch namespace")
    except Exception as exc:  # pyroute2's NetlinkError is no OSError
        code = getattr(exc, "code", None) or getattr(exc, "errno", None)
        if code == errno.ENOENT:
            return ProbeResult(False, f"the kernel has no sch_{leaf.kind} qdisc (RTM_NEWQDISC {leaf.kind}: ENOENT)")
        if code == errno.EPERM:
            return ProbeResult(False, "not allowed to add qdiscs (needs root / CAP_NET_ADMIN)")
        return ProbeResult(False, f"adding a {leaf.kind} qdisc failed: {exc}")
    finally:
        route.close()
        raw.close()
