"""Which kernel features Squall can use here, probed, not guessed: :func:`kernel_features`.

Each feature is asked of the kernel the way Squall would use it. Link kinds (veth, IFB, VXLAN, TUN),
qdiscs (HTB, TBF, ingress), the u32 classifier and the iptables matches and targets (``statistic``,
``NFQUEUE``) are *created* in a brand-new unnamed network namespace entered by one thread
(:func:`~squall.shaping.capabilities.qdisc_probe.in_scratch_namespace`): nothing is named in
``/var/run/netns``, and whatever was made there disappears with the namespace when the thread goes
home, even after an error. Only what cannot be made without changing the host is *read*:
``br_netfilter`` (its sysctls under ``/proc/sys/net/bridge``), IPVS (``/proc/net/ip_vs``) and the
NFQUEUE netlink family (``/proc/net/netfilter/nfnetlink_queue``). ``sch_netem`` comes from
:func:`squall.shaping.select.netem_probe`.

Creating a qdisc or a rule may make the kernel load its module, as a run would; a module loaded
stays loaded (that is the kernel's state, not an object Squall made). ``squall doctor`` shows the
result; nothing else depends on it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute

from squall.shaping.capabilities.qdisc_probe import in_scratch_namespace
from squall.shaping.select import netem_probe

logger = logging.getLogger(__name__)

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IPTABLES_TIMEOUT_S = 30.0

#: feature -> what in Squall uses it (the order is the order of the table).
USES: dict[str, str] = {
    "sch_netem": "netem backend: delay, jitter, loss, reordering per link",
    "htb": "rates per destination (both backends)",
    "tbf": "single-rate shaping (not used by default)",
    "u32": "netem backend: a class per destination address",
    "ingress": "shaping where packets arrive (with IFB)",
    "ifb": "shaping where packets arrive (redirect target)",
    "iptables statistic": "random drops and partitions in iptables",
    "nfqueue": "nfqueue backend: the host delay daemon",
    "br_netfilter": "iptables seeing bridged traffic (Docker networks)",
    "veth": "container links; the probes themselves",
    "vxlan": "swarm overlay networks between nodes",
    "ipvs": "swarm services' virtual IPs (without it: --endpoint-mode dnsrr)",
    "tun": "user-space tunnels (not used by default)",
}


@dataclass(frozen=True)
class Feature:
    """One kernel feature: is it there, how that was found out, and what uses it."""

    name: str
    available: bool
    how: str  # "created" (made and dropped in a scratch namespace) or "read" (a file of /proc)
    detail: str  # what happened: "added an htb qdisc", "EOPNOTSUPP: ...", "/proc/net/ip_vs is absent"
    used_for: str


def kernel_features() -> list[Feature]:
    """Every feature of :data:`USES`, in that order (see the module docstring)."""
    found: dict[str, Feature] = {}
    netem = netem_probe()
    found["sch_netem"] = _feature("sch_netem", netem.available, "created", netem.reason)
    found.update({f.name: f for f in _read_features()})
    created = in_scratch_namespace(_create_checks, _none_created, name="squall-feature-probe") or []
    for f in created:
        seen = found.get(f.name)  # nfqueue: the rule was created here, its netlink side read above
        found[f.name] = f if seen is None else Feature(
            f.name, f.available and seen.available, f"{f.how}+{seen.how}", f"{f.detail}; {seen.detail}", f.used_for)
    for name in USES:
        found.setdefault(name, _feature(name, False, "created", "the probe thread died before trying it"))
    return [found[name] for name in USES]


def _feature(name: str, available: bool, how: str, detail: str) -> Feature:
    return Feature(name, available, how, detail, USES[name])


def _read_features(proc: Path = Path("/proc")) -> list[Feature]:
    """The features read from ``proc`` of the host's own namespace (before any unshare)."""
    bridge = proc / "sys/net/bridge/bridge-nf-call-iptables"
    ipvs = proc / "net/ip_vs"
    queue = proc / "net/netfilter/nfnetlink_queue"
    return [
        _feature("br_netfilter", bridge.exists(), "read", f"{bridge} {'exists' if bridge.exists() else 'is absent'}"),
        _feature("ipvs", ipvs.exists(), "read", f"{ipvs} {'exists' if ipvs.exists() else 'is absent'}"),
        # the NFQUEUE target's rule is tried in the namespace too; this is the queue's netlink side
        _feature("nfqueue", queue.exists(), "read", f"{queue} {'exists' if queue.exists() else 'is absent'}"),
    ]


def _none_created(why: str) -> list[Feature]:
    """Every created feature unknown-as-missing, when no scratch namespace can be made."""
    return [_feature(n, False, "created", why) for n in USES if n not in ("sch_netem", "br_netfilter", "ipvs")]


def _attempt(name: str, action: Callable[[], str]) -> Feature:
    try:
        return _feature(name, True, "created", action())
    except Exception as exc:  # pyroute2's NetlinkError is no OSError; every failure is an answer here
        return _feature(name, False, "created", f"{type(exc).__name__}: {exc}")


def _create_checks() -> list[Feature]:
    features: list[Feature] = []
    with IPRoute() as ipr:
        veth = _attempt("veth", lambda: _add_veth(ipr))
        features.append(veth)
        a = _index(ipr, "sqfeat0" if veth.available else "lo")
        b = _index(ipr, "sqfeat1" if veth.available else "lo")
        features.append(_attempt("htb", lambda: _qdisc(ipr, "htb", index=a, handle=0x10000, default=0x10)))
        features.append(_attempt("u32", lambda: _u32(ipr, a)))
        features.append(_attempt("tbf", lambda: _qdisc(ipr, "tbf", index=b, handle=0x10000, rate="1mbit",
                                                       burst=10240, latency=50000)))
        features.append(_attempt("ingress", lambda: _qdisc(ipr, "ingress", index=b, handle=0xFFFF0000)))
        features.append(_attempt("ifb", lambda: _link(ipr, "sqfeatifb", "ifb")))
        features.append(_attempt("vxlan", lambda: _link(ipr, "sqfeatvx", "vxlan", vxlan_id=42, vxlan_port=4789)))
    features.append(_attempt("tun", _tun))
    features.append(_attempt("iptables statistic", lambda: _iptables(
        "-m", "statistic", "--mode", "random", "--probability", "0.5", "-j", "ACCEPT")))
    features.append(_attempt("nfqueue", lambda: _iptables("-j", "NFQUEUE", "--queue-num", "7", "--queue-bypass")))
    return features


def _add_veth(ipr: IPRoute) -> str:
    ipr.link("add", ifname="sqfeat0", kind="veth", peer="sqfeat1")
    return "added a veth pair"


def _index(ipr: IPRoute, name: str) -> int:
    return int(ipr.link_lookup(ifname=name)[0])


def _qdisc(ipr: IPRoute, kind: str, **kw: object) -> str:
    ipr.tc("add", kind, **kw)
    return f"added a qdisc of kind {kind}"


def _u32(ipr: IPRoute, index: int) -> str:
    ipr.tc("add-class", "htb", index=index, handle=0x10010, parent=0x10000, rate="10mbit", ceil="10mbit")
    ipr.tc("add-filter", "u32", index=index, handle=0, parent=0x10000, prio=1, protocol=0x0800,
           target=0x10010, keys=["0x0a000001/0xffffffff+16"])
    return "added a u32 filter on a destination address under an htb class"


def _link(ipr: IPRoute, name: str, kind: str, **kw: object) -> str:
    ipr.link("add", ifname=name, kind=kind, **kw)
    return f"added a link of kind {kind}"


def _tun() -> str:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"sqfeattun", IFF_TUN | IFF_NO_PI))
    finally:
        os.close(fd)  # a tun device that is not persistent goes with its last file descriptor
    return "opened /dev/net/tun and made a tun device"


def _iptables(*rule: str) -> str:
    """Append one mangle PREROUTING rule in the scratch namespace (the child inherits this thread's)."""
    argv = ["iptables", "-w", "-t", "mangle", "-A", "PREROUTING", *rule]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IPTABLES_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"'{' '.join(argv)}' exited {done.returncode}: {done.stderr.strip()}")
    return f"appended a rule: {' '.join(rule)}"
