"""Running the hold plan (:mod:`.hold_plan`): find the bridge, reserve queues, install and remove rules.

* :func:`bridge_namespace` finds the namespace of the bridge the endpoints' veths are plugged into
  (the host's for Docker; another namespace for :class:`~squall.shaping.testnet.bridged_lan.BridgedLan`).
  Endpoints on another machine (a swarm run: :func:`~squall.shaping.base.elsewhere`) are left out: only this machine's
  bridge is looked for, and :attr:`HoldRules.receivers` keeps only the rules of this machine's
  receivers, so a packet between machines waits once, on its receiver's machine.
* :class:`HostLock` serialises, across processes, everything that changes a shared namespace:
  picking a queue block and binding it, adding or removing a run's chain, the bridge sysctl.
* :class:`BridgeNetfilter` makes sure bridged packets pass the iptables hooks and puts the sysctl
  back at the end when it was this run that changed it (and no other run's chain remains).
* :class:`HoldRules` keeps one run's chain in step with the links the daemon must shape.

Commands run in a thread that entered the namespace (:mod:`squall.shaping.kernel.netns`), so the
host's own namespace and a named one are handled the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from squall.shaping.base import Endpoint, ShapingError, elsewhere
from squall.shaping.kernel.iptables import has_table, normalize_save, table_is_empty
from squall.shaping.kernel.netns import Namespace
from squall.shaping.kernel.nft_table import delete_table

from . import hold_plan
from .hold_plan import HoldRule

logger = logging.getLogger(__name__)

LOCK_PATH = Path(tempfile.gettempdir()) / "squall-bridge-hold.lock"  # not squall-nfq-*: those are work dirs
SYSCTL = "/proc/sys/net/bridge/bridge-nf-call-iptables"  # read in the namespace that opens it
PROC_QUEUES = "/proc/thread-self/net/netfilter/nfnetlink_queue"

_own_fd: int | None = None  # this process's namespace, held open for the process's life


def own_namespace() -> str:
    """A path to this process's network namespace that stays right while threads move around.

    ``/proc/<pid>/ns/net`` would follow the main thread into whichever container namespace it is
    visiting; ``/proc/<pid>/fd/<fd>`` names the namespace an open descriptor pins (the daemon and
    ``setns`` can open it). The first call must come from a thread in the host namespace.
    """
    global _own_fd
    if _own_fd is None:
        _own_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    return f"/proc/{os.getpid()}/fd/{_own_fd}"


def _candidates() -> list[str]:
    """Namespaces a bridge may live in: this process's, then every ``ip netns`` name."""
    paths = [own_namespace()]
    with contextlib.suppress(FileNotFoundError):
        paths += sorted(str(p) for p in Path("/run/netns").iterdir())
    return paths


def _open_all(paths: Sequence[str]) -> list[tuple[str, int]]:
    opened = []
    for path in paths:
        with contextlib.suppress(OSError):  # went away meanwhile
            opened.append((path, os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
    return opened


def _peer_namespace(endpoint: Endpoint, candidates: Sequence[str]) -> tuple[str, int]:
    """Which candidate holds the veth peer of the endpoint's device, and the peer's ifindex there.

    The endpoint's namespace names the peer's namespace by an *nsid* (``IFLA_LINK_NETNSID``); the
    same namespace is asked which nsid it gives each candidate (``RTM_GETNSID`` with its fd, opened
    before entering). Interface indices alone are not enough: namespaces built alike number their
    devices alike.
    """
    opened = _open_all(candidates)
    try:
        with Namespace(endpoint.netns).entered(), IPRoute() as ipr:
            link = ipr.link("get", ifname=endpoint.device)[0]
            peer, nsid = link.get_attr("IFLA_LINK"), link.get_attr("IFLA_LINK_NETNSID")
            if peer is None or nsid is None:
                raise ShapingError(f"node {endpoint.index}: {endpoint.device} is not a veth to another namespace: "
                                   "the nfqueue backend holds packets on the bridge its veth is plugged into")
            for path, fd in opened:
                with contextlib.suppress(NetlinkError):
                    seen = ipr.get_netnsid(fd=fd)
                    if seen is not None and seen["nsid"] == nsid:
                        return path, int(peer)
    finally:
        for _, fd in opened:
            os.close(fd)
    raise ShapingError(f"node {endpoint.index}: the veth peer of its {endpoint.device} is in none of "
                       f"{list(candidates)}: the nfqueue backend holds packets on the bridge between the namespaces")


def _is_bridge_port(path: str, index: int) -> bool:
    """Whether device ``index`` of namespace ``path`` is enslaved to a bridge."""
    try:
        with Namespace(path).entered(), IPRoute() as ipr:
            link = ipr.link("get", index=index)[0]
    except (NetlinkError, ShapingError, OSError):  # no such link there, or a namespace that went away
        return False
    info = link.get_attr("IFLA_LINKINFO")
    return link.get_attr("IFLA_MASTER") is not None and (info is None or info.get_attr("IFLA_INFO_SLAVE_KIND") in
                                                          (None, "bridge"))


def bridge_namespace(endpoints: Sequence[Endpoint]) -> str:
    """The namespace of the bridge all endpoints' veths on this machine are ports of.

    :raises ShapingError: an endpoint's veth peer is in no namespace this process can see or is not
        a bridge port, the endpoints are on bridges in different namespaces, or none is here.
    """
    found: dict[tuple[int, int], str] = {}
    candidates = _candidates()
    here = [ep for ep in endpoints if not elsewhere(ep.netns)]
    if not here:
        raise ShapingError("no endpoint runs on this machine: there is no bridge to hold packets on")
    for ep in here:
        path, peer = _peer_namespace(ep, candidates)
        if not _is_bridge_port(path, peer):
            raise ShapingError(f"node {ep.index}: the veth peer of its {ep.device} (ifindex {peer} in {path}) is "
                               "not a bridge port: the nfqueue backend holds packets on the bridge")
        st = os.stat(path)
        found.setdefault((st.st_dev, st.st_ino), path)
    if len(found) != 1:
        raise ShapingError(f"the endpoints are on bridges in {len(found)} namespaces ({sorted(found.values())}); "
                           "the nfqueue backend needs one bridge")
    return next(iter(found.values()))


@contextlib.contextmanager
def host_lock(path: Path = LOCK_PATH) -> Iterator[None]:
    """Hold the exclusive lock that serialises changes to shared namespaces across squall processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run(argv: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ShapingError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _save() -> str:
    return normalize_save(_run(["iptables-save", "-t", hold_plan.TABLE]))


def taken_queues(netns: str) -> set[int]:
    """Queue numbers in ``netns`` that are bound or that some rule sends packets to."""
    with Namespace(netns).entered():
        try:
            with open(PROC_QUEUES) as fh:
                bound = hold_plan.bound_queues(fh.read())
        except FileNotFoundError:
            bound = set()  # nfnetlink_queue not loaded yet: nothing bound
        rules = hold_plan.queues_in_rules(_run(["iptables-save"]))
    return bound | rules


class BridgeNetfilter:
    """``bridge-nf-call-iptables`` in one namespace: on while shaping, as found afterwards."""

    def __init__(self, netns: str):
        self.netns = netns
        self.changed = False  # this object switched it on

    def _read(self) -> str | None:
        try:
            with open(SYSCTL) as fh:
                return fh.read().strip()
        except FileNotFoundError:
            return None

    def ensure(self) -> None:
        """Switch bridge netfilter on if it is off (idempotent); call under :func:`host_lock`.

        :raises ShapingError: bridge netfilter is not available (no ``br_netfilter``).
        """
        with Namespace(self.netns).entered():
            value = self._read()
            if value is None:
                subprocess.run(["modprobe", "br_netfilter"], capture_output=True, check=False)
                value = self._read()
            if value is None:
                raise ShapingError(f"{SYSCTL} is missing in {self.netns}: the nfqueue backend needs bridge "
                                   "netfilter (kernel module br_netfilter; 'modprobe br_netfilter')")
            if value != "1":
                with open(SYSCTL, "w") as fh:
                    fh.write("1\n")
                self.changed = True
                logger.info("bridge-nf-call-iptables switched on in %s", self.netns)

    def restore(self) -> None:
        """Switch it off again if :meth:`ensure` switched it on and no run's hold chain is left there."""
        if not self.changed:
            return
        with Namespace(self.netns).entered():
            if hold_plan.hold_chains(_save()):
                return  # another run still relies on it; the last one puts it back
            with open(SYSCTL, "w") as fh:
                fh.write("0\n")
        self.changed = False


class HoldRules:
    """One run's hold chain in the bridge's namespace; call the methods under :func:`host_lock`."""

    def __init__(self, netns: str, run_id: str):
        self.netns = netns
        self.chain = hold_plan.chain_name(run_id)
        self.rules: tuple[HoldRule, ...] = ()
        #: addresses of the receivers on this machine; None: every receiver is (one machine)
        self.receivers: frozenset[str] | None = None
        self.installed = False  # the chain and its jump exist
        self.created_table = False  # the mangle table was absent before this run's first rule
        #: what the chain's rules had counted when they were last rewritten or removed, per (src, dst) address
        self.carried: dict[tuple[str, str], tuple[int, int]] = {}

    def sync(self, rules: Sequence[HoldRule]) -> None:
        """Make the chain hold ``rules`` (those of :attr:`receivers`): one ``iptables-restore`` transaction.

        Declaring the chain again zeroes its counters, so what they counted is read first and carried.
        """
        rules = hold_plan.for_receivers(rules, self.receivers)
        if self.installed and rules == self.rules:
            return
        if not rules:
            self.remove()
            return
        with Namespace(self.netns).entered():
            if self.installed:
                self._carry()
            if not self.installed:
                self.created_table = not has_table(normalize_save(_run(["iptables-save"])), hold_plan.TABLE)
            jump = not hold_plan.has_jump(_save(), self.chain)
            _run(["iptables-restore", "-w", "--noflush"], hold_plan.fill_script(self.chain, rules, jump=jump))
        self.rules, self.installed = rules, True

    def counts(self) -> dict[tuple[str, str], tuple[int, int]]:
        """``(source, destination) address -> (packets, bytes)`` the run's rules counted, carried ones included."""
        if not self.installed:
            return dict(self.carried)
        with Namespace(self.netns).entered():
            now = hold_plan.link_counts(_run(["iptables-save", "-c", "-t", hold_plan.TABLE]), self.chain)
        return _added(self.carried, now)

    def _carry(self) -> None:
        """In the namespace: add what the rules counted to :attr:`carried` (before they are rewritten)."""
        now = hold_plan.link_counts(_run(["iptables-save", "-c", "-t", hold_plan.TABLE]), self.chain)
        self.carried = _added(self.carried, now)

    def remove(self) -> None:
        """Remove the chain and its jump if they exist; nothing else in the table is touched."""
        with Namespace(self.netns).entered():
            if self.installed:
                with contextlib.suppress(ShapingError):
                    self._carry()
            remove_chain(self.chain)
            if self.created_table:
                _delete_table_if_empty()
        self.rules, self.installed, self.created_table = (), False, False


def _added(a: dict[tuple[str, str], tuple[int, int]],
           b: dict[tuple[str, str], tuple[int, int]]) -> dict[tuple[str, str], tuple[int, int]]:
    out = dict(a)
    for key, (packets, size) in b.items():
        p0, s0 = out.get(key, (0, 0))
        out[key] = (p0 + packets, s0 + size)
    return out


def _delete_table_if_empty() -> None:
    """Delete the mangle table (which iptables-nft creates with the first chain) when nothing is in it."""
    if has_table(normalize_save(_run(["iptables-save"])), hold_plan.TABLE) and table_is_empty(_save()):
        try:
            delete_table("/proc/thread-self/ns/net", hold_plan.TABLE)
        except OSError as exc:
            raise ShapingError(f"deleting the {hold_plan.TABLE} table: {exc}") from exc


def remove_chain(chain: str) -> bool:
    """In the current thread's namespace: remove ``chain`` and its jump; return whether it existed."""
    save = _save()
    if not hold_plan.has_chain(save, chain):
        return False
    _run(["iptables-restore", "-w", "--noflush"], hold_plan.remove_script(chain, jump=hold_plan.has_jump(save, chain)))
    return True


def leftover_chains() -> list[str]:
    """Hold chains in this process's namespace (where Docker's bridges live)."""
    try:
        return hold_plan.hold_chains(_save())
    except (ShapingError, FileNotFoundError):
        return []  # no iptables here: nothing can be left over
