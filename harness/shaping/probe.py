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
from dataclasses import dataclass

from pyroute2 import IPRoute

from harness.shaping.nfqueue.netns import CLONE_NEWNET
from harness.shaping.ops import TC_H_ROOT, Netem, QdiscOp, handle
from harness.shaping.tc import NETLINK_ROUTE, NetemSender

logger = logging.getLogger(__name__)
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ProbeResult:
    """Whether netem works here, and why not."""

    available: bool  # a netem qdisc could be added
    reason: str  # what happened, for logs and errors


@functools.cache
def netem_probe() -> ProbeResult:
    """Try netem once per process (see the module docstring)."""
    box: list[ProbeResult] = []
    thread = threading.Thread(target=lambda: box.append(_probe_here()), name="squall-netem-probe")
    thread.start()
    thread.join()
    result = box[0] if box else ProbeResult(False, "the probe thread died")
    logger.info("netem probe: %s (%s)", "available" if result.available else "unavailable", result.reason)
    return result


def netem_available() -> bool:
    """Whether the netem backend can run on this kernel (cached)."""
    return netem_probe().available


def _probe_here() -> ProbeResult:
    """Runs on its own thread: scratch namespace, veth, netem, back home."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            return ProbeResult(False, f"cannot create a scratch network namespace: {os.strerror(err)}")
        try:
            return _try_netem()
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:  # pragma: no cover - never refused
                logger.error("netem probe: cannot return to the host namespace")
    finally:
        os.close(home)


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
