"""Configuration of the NFQUEUE delay daemon: frozen dataclasses and their JSON form.

The daemon reads one JSON document (never pickle)::

    {
      "control_socket": "/run/squall/nfq-run1.sock",
      "queue_maxlen": 100000,
      "namespaces": [
        {"name": "worker-1", "netns": "/proc/4242/ns/net",
         "queues": [
           {"queue": 1, "source": "172.20.0.2", "seed": 7,
            "link": {"delay_us": 20000, "jitter_us": 5000, "distribution": "uniform", "loss": 0.01}}
         ]}
      ]
    }

Every key of :class:`LinkParams` is optional (default: a perfect link); unknown keys are rejected, so
a typo fails loudly instead of silently shaping nothing. The same ``link`` objects are the payload of
the ``set_links`` control command.

A link's values are in the canonical units of the settings table (:mod:`squall.profiles.settings`):
integer microseconds, probabilities and correlations as fractions from 0 to 1; the daemon's names
for them are its own (``jitter_correlation``, ``gilbert_elliott``). The bounds and the rules between
them are the settings' (:mod:`squall.profiles.bounds`, :mod:`squall.profiles.link_rules`), checked
here again because the daemon reads its configuration from outside.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from squall.profiles.bounds import is_correlation, is_probability
from squall.profiles.link_rules import (
    GEMODEL_PARTS,
    correlated_only_if_set,
    gemodel_moves,
    one_loss_model,
    reorder_has_delay,
)

from .errors import ConfigError

Distribution = Literal["uniform", "normal", "pareto", "paretonormal"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)
MAX_QUEUE = 65535  # NFQUEUE numbers are 16 bit (nfgenmsg.res_id)


def _require(cond: bool, why: str) -> None:
    if not cond:
        raise ConfigError(why)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GilbertElliott:
    """Two-state Markov loss model, parameters as in ``netem loss gemodel p r 1-h 1-k``.

    Per packet the state first moves (good->bad with ``p``, bad->good with ``r``), then the packet
    is lost with the new state's loss probability. Mean bad-state sojourn is ``1/r`` packets.
    """

    p: float  # P(good -> bad) per packet
    r: float  # P(bad -> good) per packet
    loss_bad: float = 1.0  # 1-h: loss probability in the bad state
    loss_good: float = 0.0  # 1-k: loss probability in the good state

    def __post_init__(self) -> None:
        for name in GEMODEL_PARTS:
            _require(is_probability(getattr(self, name)), f"gilbert_elliott.{name} must be in [0, 1]")
        _require(gemodel_moves(self.p, self.r), "gilbert_elliott needs p + r > 0 (otherwise it never moves)")

    @property
    def bad_fraction(self) -> float:
        """Stationary probability of the bad state, ``p / (p + r)``."""
        return self.p / (self.p + self.r)

    @property
    def loss_rate(self) -> float:
        """Long-run fraction of packets lost."""
        bad = self.bad_fraction
        return bad * self.loss_bad + (1.0 - bad) * self.loss_good


@dataclass(frozen=True)
class LinkParams:
    """What one directed link does to packets; times are integer microseconds.

    ``jitter_us`` is the half-width for ``uniform`` (delay in ``[d-j, d+j]``, as netem) and the
    standard deviation for ``normal``, ``pareto`` and ``paretonormal``. With jitter, packets are
    released in the order of their release times, so they may overtake each other (netem
    semantics) unless ``preserve_order`` clamps each release time to be no earlier than the
    previous one. A reordered packet (probability ``reorder``) is released at once, skipping the
    delay, like netem's ``reorder``.
    """

    delay_us: int = 0  # constant one-way delay added at the receiver
    jitter_us: int = 0  # see class docstring
    distribution: Distribution = "uniform"  # shape of the jitter
    jitter_correlation: float = 0.0  # lag-1 correlation of successive jitter draws, [0, 1)
    loss: float = 0.0  # random loss probability
    loss_correlation: float = 0.0  # lag-1 correlation of successive loss events, [0, 1)
    gilbert_elliott: GilbertElliott | None = None  # bursty loss; excludes ``loss``
    reorder: float = 0.0  # probability that a packet skips the delay
    reorder_correlation: float = 0.0  # lag-1 correlation of reorder events, [0, 1)
    preserve_order: bool = False  # never let jitter reorder packets (FIFO, batch verdicts)

    def __post_init__(self) -> None:
        _require(_is_int(self.delay_us) and self.delay_us >= 0, "delay_us must be an integer >= 0")
        _require(_is_int(self.jitter_us) and self.jitter_us >= 0, "jitter_us must be an integer >= 0")
        _require(self.distribution in DISTRIBUTIONS, f"distribution must be one of {DISTRIBUTIONS}")
        for name in ("loss", "reorder"):
            _require(is_probability(getattr(self, name)), f"{name} must be a probability in [0, 1]")
        for name in ("jitter_correlation", "loss_correlation", "reorder_correlation"):
            _require(is_correlation(getattr(self, name)), f"{name} must be in [0, 1)")
        _require(isinstance(self.preserve_order, bool), "preserve_order must be a boolean")
        _require(
            self.gilbert_elliott is None or isinstance(self.gilbert_elliott, GilbertElliott),
            "gilbert_elliott must be a GilbertElliott",
        )
        for chance, correlation in (("jitter_us", "jitter_correlation"), ("loss", "loss_correlation"),
                                    ("reorder", "reorder_correlation")):
            _require(correlated_only_if_set(getattr(self, chance), getattr(self, correlation)),
                     f"{correlation} requires {chance}")
        _require(one_loss_model(self.loss, self.gilbert_elliott),
                 "loss and gilbert_elliott are two loss models; give one")
        _require(reorder_has_delay(self.reorder, self.delay_us), "reorder requires delay_us > 0")

    @property
    def is_constant(self) -> bool:
        """True when every packet gets exactly ``delay_us``: no jitter, loss or reordering."""
        return self.jitter_us == 0 and self.loss == 0 and self.gilbert_elliott is None and self.reorder == 0


@dataclass(frozen=True)
class QueueSpec:
    """One NFQUEUE in one namespace: the packets from one source peer."""

    queue: int  # NFQUEUE number, unique within its namespace
    link: LinkParams = field(default_factory=LinkParams)  # what the link does
    seed: int = 0  # seeds this link's RNG: same seed and traffic, same decisions
    source: str | None = None  # source address the iptables rule matches (informational here)

    def __post_init__(self) -> None:
        _require(_is_int(self.queue) and 0 <= self.queue <= MAX_QUEUE, "queue must be in [0, 65535]")
        _require(_is_int(self.seed), "seed must be an integer")
        _require(isinstance(self.link, LinkParams), "link must be a LinkParams")
        _require(self.source is None or isinstance(self.source, str), "source must be a string")


@dataclass(frozen=True)
class NamespaceSpec:
    """A receiving network namespace and the queues the daemon binds in it."""

    name: str  # key used by control commands, e.g. the container name
    netns: str  # path of a netns file: /proc/<pid>/ns/net or /run/netns/<name>
    queues: tuple[QueueSpec, ...] = ()  # bound on one netlink socket in that namespace

    def __post_init__(self) -> None:
        _require(isinstance(self.name, str) and bool(self.name), "namespace name must be a non-empty string")
        _require(isinstance(self.netns, str) and self.netns.startswith("/"), "netns must be an absolute path")
        numbers = [q.queue for q in self.queues]
        _require(len(set(numbers)) == len(numbers), f"namespace {self.name!r} lists a queue twice")

    @classmethod
    def for_pid(cls, name: str, pid: int, queues: Sequence[QueueSpec] = ()) -> NamespaceSpec:
        """The network namespace of process ``pid`` (e.g. a container's init, ``docker inspect``)."""
        return cls(name=name, netns=f"/proc/{pid}/ns/net", queues=tuple(queues))

    @classmethod
    def for_named(cls, name: str, netns_name: str, queues: Sequence[QueueSpec] = ()) -> NamespaceSpec:
        """A namespace created by ``ip netns add <netns_name>``."""
        return cls(name=name, netns=f"/run/netns/{netns_name}", queues=tuple(queues))


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon needs at start; namespaces can be added and links changed later."""

    control_socket: str  # Unix stream socket path for JSON-lines control commands
    namespaces: tuple[NamespaceSpec, ...] = ()  # bound before the daemon reports ready
    queue_maxlen: int = 100_000  # kernel queue length per queue; must exceed rate x delay
    rcvbuf_bytes: int = 16 << 20  # SO_RCVBUFFORCE per namespace socket
    release_slack_us: int = 20  # release packets due within this much of now in the same pass
    drain_batch: int = 64  # packets read from one socket before timers are looked at again
    fail_open: bool = False  # accept (unshaped) instead of drop when the kernel queue is full

    def __post_init__(self) -> None:
        _require(
            isinstance(self.control_socket, str) and bool(self.control_socket), "control_socket is required"
        )
        _require(
            _is_int(self.queue_maxlen) and self.queue_maxlen > 0, "queue_maxlen must be a positive integer"
        )
        _require(_is_int(self.rcvbuf_bytes) and self.rcvbuf_bytes >= 1 << 16, "rcvbuf_bytes must be >= 65536")
        _require(
            _is_int(self.release_slack_us) and self.release_slack_us >= 0, "release_slack_us must be >= 0"
        )
        _require(_is_int(self.drain_batch) and self.drain_batch > 0, "drain_batch must be a positive integer")
        _require(isinstance(self.fail_open, bool), "fail_open must be a boolean")
        names = [ns.name for ns in self.namespaces]
        _require(len(set(names)) == len(names), "namespace names must be unique")


# ----------------------------------------------------------------------------- JSON


_T = TypeVar("_T")


def _fields_of(cls: type[Any], data: object, what: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what} must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{what}: unknown keys {unknown}; known keys are {sorted(known)}")
    return dict(data)


def _build(cls: type[_T], kwargs: dict[str, Any], what: str) -> _T:
    missing = sorted(
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"{what}: missing keys {missing}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _finite_numbers(kwargs: dict[str, Any], what: str) -> None:
    for key, value in kwargs.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{what}.{key} must be finite")


def link_from_dict(data: object, what: str = "link") -> LinkParams:
    """Parse a ``link`` object; missing keys take the defaults of :class:`LinkParams`."""
    kwargs = _fields_of(LinkParams, data, what)
    _finite_numbers(kwargs, what)
    ge = kwargs.get("gilbert_elliott")
    if ge is not None:
        ge_kwargs = _fields_of(GilbertElliott, ge, f"{what}.gilbert_elliott")
        kwargs["gilbert_elliott"] = _build(GilbertElliott, ge_kwargs, f"{what}.gilbert_elliott")
    return _build(LinkParams, kwargs, what)


def queue_from_dict(data: object, what: str = "queue") -> QueueSpec:
    """Parse one queue entry of a namespace."""
    kwargs = _fields_of(QueueSpec, data, what)
    kwargs["link"] = link_from_dict(kwargs.get("link", {}), f"{what}.link")
    return _build(QueueSpec, kwargs, what)


def namespace_from_dict(data: object, what: str = "namespace") -> NamespaceSpec:
    """Parse one namespace entry."""
    kwargs = _fields_of(NamespaceSpec, data, what)
    queues = kwargs.get("queues", [])
    if not isinstance(queues, list):
        raise ConfigError(f"{what}.queues must be a list")
    kwargs["queues"] = tuple(queue_from_dict(q, f"{what}.queues[{i}]") for i, q in enumerate(queues))
    return _build(NamespaceSpec, kwargs, what)


def config_from_dict(data: object) -> DaemonConfig:
    """Parse the whole daemon configuration."""
    kwargs = _fields_of(DaemonConfig, data, "config")
    namespaces = kwargs.get("namespaces", [])
    if not isinstance(namespaces, list):
        raise ConfigError("config.namespaces must be a list")
    kwargs["namespaces"] = tuple(
        namespace_from_dict(ns, f"namespaces[{i}]") for i, ns in enumerate(namespaces)
    )
    return _build(DaemonConfig, kwargs, "config")


def config_from_json(text: str) -> DaemonConfig:
    """Parse a JSON document into a :class:`DaemonConfig`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config is not valid JSON: {exc}") from None
    return config_from_dict(data)


def to_jsonable(value: object) -> Any:
    """Dataclasses (nested) as plain JSON values; tuples become lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def config_to_json(config: DaemonConfig) -> str:
    """The JSON document :func:`config_from_json` reads back to an equal config."""
    return json.dumps(to_jsonable(config), indent=2, sort_keys=True)
