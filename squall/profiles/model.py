"""The resolved values a profile hands to the rest of the harness: links, node links, churn, devices.

Everything here is a frozen dataclass whose defaults mean "no impairment". Units are in field
names: ``_us`` integer microseconds, ``_s`` float seconds, ``_bps`` integer bits per second,
``_packets`` whole packets; a ``probability`` or ``correlation`` is a fraction from 0 to 1, and so
are the Gilbert-Elliott parameters. These are the canonical units of the link settings (each row of
:mod:`.settings` names its own): profiles are read into them (``1%`` becomes 0.01), the shaping
plans carry them, and each backend translates them once, where it writes them.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass


class Distribution(enum.StrEnum):
    """Shape of the delay jitter, as netem's distribution tables name it."""

    UNIFORM = "uniform"  # "every delay in [delay - jitter, delay + jitter] equally likely"
    NORMAL = "normal"  # "jitter is one standard deviation"
    PARETO = "pareto"  # "heavy tail: a few packets are very late"
    PARETONORMAL = "paretonormal"  # "netem's mix of the two"


@dataclass(frozen=True)
class Jitter:
    """Random variation of the delay."""

    amount_us: int = 0  # spread around the delay, integer microseconds; 0 = none
    distribution: Distribution = Distribution.UNIFORM  # shape of the spread
    correlation: float = 0.0  # how much each packet's jitter follows the previous one's, [0, 1)


@dataclass(frozen=True)
class GilbertElliott:
    """Bursty loss: a two-state Markov chain, netem's ``loss gemodel p r 1-h 1-k``; probabilities 0-1."""

    p: float  # chance per packet of moving from the good to the bad state
    r: float  # chance per packet of moving from the bad back to the good state
    loss_bad: float = 1.0  # netem's 1-h: loss probability while in the bad state
    loss_good: float = 0.0  # netem's 1-k: loss probability while in the good state

    @property
    def mean_loss(self) -> float:
        """Long-run loss probability: the stationary share of each state times its loss probability."""
        if self.p + self.r == 0:
            return self.loss_good
        bad_share = self.p / (self.p + self.r)
        return bad_share * self.loss_bad + (1 - bad_share) * self.loss_good


@dataclass(frozen=True)
class Loss:
    """Packet loss: random (Bernoulli, optionally correlated) or Gilbert-Elliott bursts."""

    probability: float = 0.0  # random loss, 0-1; 0 when gemodel is used
    correlation: float = 0.0  # netem's loss correlation, [0, 1); only with probability > 0
    gemodel: GilbertElliott | None = None  # bursty loss instead of random loss

    @property
    def mean(self) -> float:
        """The long-run share of packets lost (0-1)."""
        return self.gemodel.mean_loss if self.gemodel else self.probability


@dataclass(frozen=True)
class Chance:
    """A per-packet chance with netem's correlation: used for duplication and reordering."""

    probability: float = 0.0  # chance per packet, 0-1
    correlation: float = 0.0  # how much each draw follows the previous one, [0, 1); only with probability > 0


@dataclass(frozen=True)
class LinkSpec:
    """The effective settings of one directed link src -> dst; the defaults are a perfect link."""

    delay_us: int = 0  # one-way delay added to every packet
    jitter: Jitter = Jitter()  # random variation of that delay
    loss: Loss = Loss()  # packets dropped
    duplicate: Chance = Chance()  # packets sent twice
    reorder: Chance = Chance()  # packets sent at once instead of delayed (netem needs delay > 0)
    rate_bps: int | None = None  # bandwidth of this link; None = unlimited
    limit_packets: int | None = None  # queue length; None = the shaping backend chooses (rate x delay)

    @property
    def impaired(self) -> bool:
        """Whether anything differs from a perfect link."""
        return self != LinkSpec()

    def to_dict(self) -> dict[str, object]:
        """Plain data (enums as their strings) for JSON and tables."""
        return _plain(dataclasses.asdict(self))


@dataclass(frozen=True)
class NodeLinkSpec:
    """Bandwidth one node shares among all its links (an access link), on top of per-link rates."""

    uplink_bps: int | None = None  # total rate of everything the node sends; None = unlimited
    downlink_bps: int | None = None  # total rate of everything the node receives; None = unlimited


class ChurnKind(enum.StrEnum):
    """What happens to nodes or links at a point in time."""

    KILL = "kill"  # "the node's process dies (SIGKILL); it stays down until restart"
    PAUSE = "pause"  # "the node freezes (SIGSTOP/docker pause); its sockets stay open"
    RESUME = "resume"  # "a paused node carries on"
    RESTART = "restart"  # "the node starts again (a live one is killed first)"
    LINK_DOWN = "link_down"  # "these directed links drop every packet"
    LINK_UP = "link_up"  # "these directed links carry packets again"
    PARTITION = "partition"  # "traffic between the groups is dropped; inside a group it flows"
    HEAL = "heal"  # "the partition ends"


@dataclass(frozen=True)
class ChurnEvent:
    """One concrete churn action at one time, for a cluster of known size."""

    at_s: float  # seconds from the start of the run
    kind: ChurnKind  # what happens
    nodes: tuple[int, ...] = ()  # kill/pause/resume/restart: the nodes it happens to
    links: tuple[tuple[int, int], ...] = ()  # link_down/link_up: directed links (src, dst)
    groups: tuple[tuple[int, ...], ...] = ()  # partition: disjoint groups covering every node
    origin: str = ""  # key path in the profile that produced it, e.g. "churn.random[0]"

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON and tables."""
        return _plain(dataclasses.asdict(self))


@dataclass(frozen=True)
class DeviceSpec:
    """How fast one node computes, read by the training loop (the harness cannot slow a CPU down).

    Plain data: the per-step and per-micro-batch draws (``step_factor``, ``microbatch_factor``,
    ``mean_factor``, ``mean_microbatch_factor``) are defined once, by the training side's
    :class:`squall.training.device.DeviceModel`, built from :meth:`to_dict`.
    """

    node: int  # the node this is for
    seed: int  # the profile's device seed; per-step draws mix in node and step
    step_time_s: float | None = None  # base compute time of one step; None = whatever the task takes
    slowdown: float = 1.0  # constant factor on every step: 3.0 = three times slower
    straggler_probability: float = 0.0  # chance, each step, that the step straggles
    straggler_factor: float = 1.0  # how many times longer a straggling step takes
    noise_sigma: float = 0.0  # sigma of multiplicative log-normal noise per step (median 1); 0 = none
    microbatch_noise: str | None = None  # per-micro-batch draws: None or "dropcompute-lognormal"
    microbatch_delay_factor: float = 0.0  # DropCompute's delay_factor (0 = no micro-batch noise)

    def to_dict(self) -> dict[str, object]:
        """Plain data for JSON and tables."""
        return _plain(dataclasses.asdict(self))


def _plain(value: object) -> dict[str, object]:
    """``asdict`` output with enums turned into their string values and tuples into lists."""

    def convert(item: object) -> object:
        if isinstance(item, enum.Enum):
            return item.value
        if isinstance(item, dict):
            return {key: convert(val) for key, val in item.items()}
        if isinstance(item, list | tuple):
            return [convert(val) for val in item]
        return item

    converted = convert(value)
    assert isinstance(converted, dict)
    return converted
