"""Where the nfqueue backend holds packets: between the namespaces, on the bridge. The pure plan.

Why there. A packet held in the receiver's ``PREROUTING`` has already been stamped by the
receiver's kernel (receive timestamps, ``ping``, packet captures see only the other direction's
delay). On the bridge that joins the containers' veths it has left the sender (crossing the veth
moved it to another namespace) and has not reached the receiver, so everything in the receiver
sees the configured delay. Bridged IPv4 packets pass the ``iptables`` hooks of the bridge's
namespace when bridge netfilter is on (``net.bridge.bridge-nf-call-iptables = 1``).

The rules. One chain per run in the ``mangle`` table of the bridge's namespace, one jump to it at
the top of ``PREROUTING``, one rule per shaped directed link::

    -A SQUALL-<run>-nq -s <src>/32 -d <dst>/32 -j NFQUEUE --queue-num <q> --queue-bypass

A link the daemon has nothing to do for gets a rule without a target, which only counts: every
directed link then has one rule, and the rules' counters are the kernel's count of what each link
carried (:func:`link_counts`; read before a rewrite of the chain and carried over, :mod:`.hold`).

The bridge's namespace is shared (on a Docker host it is the host's, with Docker's own rules and
other runs' chains), so each run takes a block of queue numbers nobody has bound
(:func:`choose_base`) and queue ``base + receiver * nodes + source`` carries one directed link
(:class:`QueueBlock`). Removal touches only the run's chain and its jump.

Everything here is pure (strings in, strings out) and table-tested; :mod:`.hold` runs it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from .config import MAX_QUEUE
from .errors import RulesError

TABLE = "mangle"
HOOK = "PREROUTING"
CHAIN_PREFIX = "SQUALL-"
CHAIN_SUFFIX = "-nq"
MAX_CHAIN = 28  # iptables chain names: XT_EXTENSION_MAXNAMELEN - 1
FIRST_QUEUE = 1024  # blocks start here: low numbers are the ones people pick by hand
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_CHAIN = re.compile(rf"^:({re.escape(CHAIN_PREFIX)}([A-Za-z0-9_.-]+){re.escape(CHAIN_SUFFIX)}) ")


@dataclass(frozen=True)
class QueueBlock:
    """The queue numbers of one run: ``base + receiver * nodes + source``."""

    base: int  # first number of the block
    nodes: int  # node indices are 0 .. nodes - 1

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes < 2:
            raise RulesError(f"queue block: nodes={self.nodes!r}; allowed: an integer >= 2")
        fits = isinstance(self.base, int) and not isinstance(self.base, bool) and self.base >= 0
        if not fits or self.base + self.size - 1 > MAX_QUEUE:
            raise RulesError(
                f"queue block: base={self.base!r} with {self.nodes} nodes; allowed: 0 .. {MAX_QUEUE - self.size + 1}"
            )

    @property
    def size(self) -> int:
        """How many numbers the block spans."""
        return self.nodes * self.nodes

    def queue(self, receiver: int, source: int) -> int:
        """The queue of the directed link ``source -> receiver``."""
        for what, node in (("receiver", receiver), ("source", source)):
            if not 0 <= node < self.nodes:
                raise RulesError(f"queue block: {what}={node}; allowed: 0 .. {self.nodes - 1}")
        if receiver == source:
            raise RulesError(f"queue block: node {source} has no link to itself")
        return self.base + receiver * self.nodes + source

    def numbers(self) -> range:
        """Every number in the block."""
        return range(self.base, self.base + self.size)


@dataclass(frozen=True)
class HoldRule:
    """Packets from ``source`` to ``destination`` wait in queue ``queue`` (None: they are only counted)."""

    source: str  # sender's IPv4 address
    destination: str  # receiver's IPv4 address
    queue: int | None  # NFQUEUE number in the bridge's namespace; None: a counting rule without a target

    def __post_init__(self) -> None:
        for what in ("source", "destination"):
            value = getattr(self, what)
            try:
                address = ipaddress.ip_address(value)
            except ValueError:
                raise RulesError(f"hold rule: {what}={value!r}; allowed: an IPv4 address") from None
            if address.version != 4:
                raise RulesError(f"hold rule: {what}={value!r}; allowed: an IPv4 address")
        if self.queue is not None and not 0 <= self.queue <= MAX_QUEUE:
            raise RulesError(f"hold rule: queue={self.queue}; allowed: 0 .. {MAX_QUEUE}")


def for_receivers(rules: Sequence[HoldRule], receivers: Collection[str] | None) -> tuple[HoldRule, ...]:
    """The rules whose receiver is one of ``receivers`` (None: all of them).

    On a machine that holds only some of a run's endpoints (a swarm node), a packet between two
    machines crosses both machines' bridges: held only where its receiver is, it waits once.
    """
    if receivers is None:
        return tuple(rules)
    return tuple(r for r in rules if r.destination in receivers)


def chain_name(run_id: str) -> str:
    """``SQUALL-<run id>-nq``, validated against iptables' name rules."""
    name = f"{CHAIN_PREFIX}{run_id}{CHAIN_SUFFIX}"
    if not _RUN_ID.match(run_id) or len(name) > MAX_CHAIN:
        longest = MAX_CHAIN - len(CHAIN_PREFIX) - len(CHAIN_SUFFIX)
        raise RulesError(f"run id {run_id!r}: allowed: [A-Za-z0-9_.-], at most {longest} characters")
    return name


def run_of_chain(name: str) -> str | None:
    """The run id in a hold chain's name, or None when ``name`` is not one."""
    if name.startswith(CHAIN_PREFIX) and name.endswith(CHAIN_SUFFIX):
        run = name[len(CHAIN_PREFIX):-len(CHAIN_SUFFIX)]
        return run if run and _RUN_ID.match(run) else None
    return None


def hold_chains(save_text: str) -> list[str]:
    """Names of every run's hold chain declared in an ``iptables-save -t mangle``."""
    return [m.group(1) for m in map(_CHAIN.match, save_text.splitlines()) if m]


def rule_line(chain: str, rule: HoldRule) -> str:
    """One rule as ``iptables-restore`` reads it."""
    match = f"-A {chain} -s {rule.source}/32 -d {rule.destination}/32"
    return match if rule.queue is None else f"{match} -j NFQUEUE --queue-num {rule.queue} --queue-bypass"


def fill_script(chain: str, rules: Sequence[HoldRule], *, jump: bool) -> str:
    """Declare (and so flush) the chain, append ``rules``, and with ``jump`` add the jump to it."""
    queues = [r.queue for r in rules if r.queue is not None]
    if len({(r.source, r.destination) for r in rules}) != len(rules) or len(set(queues)) != len(queues):
        raise RulesError("hold rules: each link and each queue may appear once")
    lines = [f"*{TABLE}", f":{chain} - [0:0]", *(rule_line(chain, r) for r in rules)]
    if jump:
        lines.append(f"-I {HOOK} 1 -j {chain}")
    return "\n".join([*lines, "COMMIT", ""])


def remove_script(chain: str, *, jump: bool) -> str:
    """Flush the chain, remove its jump (when present) and delete it."""
    lines = [f"*{TABLE}", f":{chain} - [0:0]"]
    if jump:
        lines.append(f"-D {HOOK} -j {chain}")
    return "\n".join([*lines, f"-X {chain}", "COMMIT", ""])


def has_jump(save_text: str, chain: str) -> bool:
    """Whether a normalized ``iptables-save`` shows the jump to ``chain``."""
    return f"-A {HOOK} -j {chain}" in save_text.splitlines()


def has_chain(save_text: str, chain: str) -> bool:
    """Whether a normalized ``iptables-save`` declares ``chain``."""
    return any(line.startswith(f":{chain} ") for line in save_text.splitlines())


def bound_queues(proc_text: str) -> set[int]:
    """Queue numbers bound in a namespace, from its ``/proc/net/netfilter/nfnetlink_queue``."""
    bound = set()
    for line in proc_text.splitlines():
        cols = line.split()
        if cols and cols[0].isdigit():
            bound.add(int(cols[0]))
    return bound


def queues_in_rules(save_text: str) -> set[int]:
    """Queue numbers that rules in a ``iptables-save`` send packets to (bound or not)."""
    return {int(m) for m in re.findall(r"--queue-num (\d+)", save_text)}


def choose_base(nodes: int, taken: Iterable[int], first: int = FIRST_QUEUE) -> int:
    """The lowest block start at or above ``first``, aligned to the block size, that holds no taken number.

    :raises RulesError: when no block fits below 65536.
    """
    size = nodes * nodes
    taken_set = set(taken)
    start = -(-first // size) * size
    for base in range(start, MAX_QUEUE - size + 2, size):
        if not any(q in taken_set for q in range(base, base + size)):
            return base
    raise RulesError(f"no free block of {size} NFQUEUE numbers in {first} .. {MAX_QUEUE} for {nodes} nodes")


_ADDRESS = r"(\d+\.\d+\.\d+\.\d+)(?:/32)?"
_COUNTED = re.compile(rf"^\[(\d+):(\d+)\] -A (\S+) -s {_ADDRESS} -d {_ADDRESS}(?: |$)")


def link_counts(save_text: str, chain: str) -> dict[tuple[str, str], tuple[int, int]]:
    """``(source, destination) -> (packets, bytes)`` of ``chain``'s rules in an ``iptables-save -c``."""
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    for line in save_text.splitlines():
        m = _COUNTED.match(line)
        if m and m.group(3) == chain:
            key = (m.group(4), m.group(5))
            packets, size = counts.get(key, (0, 0))
            counts[key] = (packets + int(m.group(1)), size + int(m.group(2)))
    return counts
