"""Does this kernel have ``sch_netem``? Ask it: add a netem qdisc in a scratch namespace.

The probe runs on a thread of its own that ``unshare(CLONE_NEWNET)``s into a brand-new, unnamed
namespace, creates a veth pair there, sends the same raw ``RTM_NEWQDISC`` netem request the
backend would send (:mod:`.netem_wire`), then goes back to the host namespace. The scratch
namespace has no name and no other user, so it disappears as soon as the thread's sockets are
closed: nothing is created in ``/var/run/netns`` and nothing can be left behind, even on an error.

The answer is cached per process; :func:`netem_probe` also says why netem is missing (no such
qdisc, not root, ...), for the error :func:`.select.open_shaper` raises when netem is forced.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pyroute2 import IPRoute

from squall.shaping.netns import CLONE_NEWNET
from squall.shaping.ops import TC_H_ROOT, Netem, QdiscOp, handle
from squall.shaping.tc import NETLINK_ROUTE, NetemSender

logger = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult:
    """Whether netem works here, and why not."""

    available: bool  # a netem qdisc could be added
    reason: str  # what happened, for logs and errors


@functools.cache
def netem_probe() -> ProbeResult:
    """Try netem once per process (see the module docstring)."""
    result = in_scratch_namespace(_try_netem, lambda why: ProbeResult(False, why), name="squall-netem-probe")
    if result is None:
        result = ProbeResult(False, "the probe thread died")
    logger.info("netem probe: %s (%s)", "available" if result.available else "unavailable", result.reason)
    return result


def netem_available() -> bool:
    """Whether the netem backend can run on this kernel (cached)."""
    return netem_probe().available


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


def _try_netem() -> ProbeResult:
    route = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
    raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        with IPRoute(use_socket=route) as ipr:
            ipr.link("add", ifname="sqprobe0", kind="veth", peer="sqprobe1")
            index = int(ipr.link_lookup(ifname="sqprobe0")[0])
            netem = Netem(delay_us=1000)
            NetemSender(raw).send(index, QdiscOp("sqprobe0", TC_H_ROOT, handle(1), netem), netem, create=True)
            return ProbeResult(True, "added a netem qdisc in a scratch namespace")
    except Exception as exc:  # pyroute2's NetlinkError is no OSError
        code = getattr(exc, "code", None) or getattr(exc, "errno", None)
        if code == errno.ENOENT:
            return ProbeResult(False, "the kernel has no sch_netem qdisc (RTM_NEWQDISC netem: ENOENT)")
        if code == errno.EPERM:
            return ProbeResult(False, "not allowed to add qdiscs (needs root / CAP_NET_ADMIN)")
        return ProbeResult(False, f"adding a netem qdisc failed: {exc}")
    finally:
        route.close()
        raw.close()
