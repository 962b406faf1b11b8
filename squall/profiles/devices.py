"""Device model: how fast each node computes (``devices:``), for the training loop to apply.

``default`` applies to every node, a ``nodes`` entry overrides it key by key (``step_time``,
``slowdown``, ``straggler``, ``noise``, ``microbatch_noise``); a node may be named by one ``nodes``
entry only. The draws themselves are defined by ``squall.training.device.DeviceModel``; this
module only reads and bounds the settings (the profiles layer imports nothing from protocols/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from squall.profiles.errors import Origin, Section, expect_list, parse_at
from squall.profiles.model import DeviceSpec
from squall.profiles.selectors import NodeSelector, parse_selector
from squall.profiles.units import (
    UnitError,
    parse_factor,
    parse_int,
    parse_positive_duration_us,
    parse_probability,
)

DEVICE_KEYS: Final = ("step_time", "slowdown", "straggler", "noise", "microbatch_noise")
MAX_SIGMA: Final = 3.0
#: Per-micro-batch noise distributions (``squall.training.device.MICROBATCH_NOISES``).
DROPCOMPUTE_LOGNORMAL: Final = "dropcompute-lognormal"
MICROBATCH_DISTRIBUTIONS: Final = (DROPCOMPUTE_LOGNORMAL,)
NO_MICROBATCH_NOISE: Final = "none"
#: Largest delay_factor (``squall.training.device.MAX_DELAY_FACTOR``): a micro-batch then lasts at
#: most 1 + 0.5 x 100 x 11.4 = 571 times its nominal time.
MAX_DELAY_FACTOR: Final = 100.0


@dataclass(frozen=True)
class Straggler:
    """Occasional slow steps."""

    probability: float  # chance per step, 0-1
    factor: float  # how many times longer such a step takes (>= 1)


@dataclass(frozen=True)
class MicrobatchNoise:
    """Per-micro-batch straggler draws (DropCompute's injection); ``distribution`` None = none."""

    distribution: str | None  # "dropcompute-lognormal", or None to switch it off
    delay_factor: float  # the paper's delay_factor: extra time mult x t x 0.5 x this (0 = none)


@dataclass(frozen=True)
class DevicePatch:
    """One device section as written: only the keys it sets are not None."""

    origin: Origin  # devices.default or devices.nodes[i]
    step_time_us: int | None = None  # base compute time per step
    slowdown: float | None = None  # constant factor
    straggler: Straggler | None = None  # occasional slow steps
    noise_sigma: float | None = None  # log-normal per-step noise
    microbatch_noise: MicrobatchNoise | None = None  # per-micro-batch draws


def _sigma(value: object) -> float:
    """A log-normal sigma: a plain number from 0 to MAX_SIGMA."""
    allowed = f"a number from 0 to {MAX_SIGMA:g} (0.1 = about +-10% per step)"
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SIGMA:
        raise UnitError("not a log-normal sigma", allowed)
    return float(value)


def _straggler(origin: Origin, raw: object) -> Straggler:
    """``{probability: 5%, factor: 4}``."""
    section = Section(origin, raw, ("probability", "factor"))
    straggler = Straggler(
        section.require("probability", parse_probability, "a percentage such as 5%"),
        section.require("factor", parse_factor, "a factor >= 1 such as 4"),
    )
    if straggler.factor < 1:
        raise origin.at("factor").error(
            "a straggler is slower, not faster", value=straggler.factor, allowed=">= 1"
        )
    return straggler


def _noise(origin: Origin, raw: object) -> float:
    """``0.1`` or ``{sigma: 0.1}``."""
    if isinstance(raw, dict):
        return Section(origin, raw, ("sigma",)).require("sigma", _sigma, "a number such as 0.1")
    return parse_at(origin, raw, _sigma)


def _delay_factor(value: object) -> float:
    """DropCompute's ``delay_factor``: a plain number from 0 to MAX_DELAY_FACTOR."""
    allowed = (
        f"a number from 0 to {MAX_DELAY_FACTOR:g} (1 = the paper's: each micro-batch lasts"
        " 1 + 0.5 x mult times its nominal time; 0 = no micro-batch noise)"
    )
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DELAY_FACTOR:
        raise UnitError("not a delay factor", allowed)
    return float(value)


def _distribution(value: object) -> str | None:
    """A micro-batch noise distribution's name, or ``none``."""
    names = (*MICROBATCH_DISTRIBUTIONS, NO_MICROBATCH_NOISE)
    if not isinstance(value, str) or value not in names:
        raise UnitError("unknown micro-batch noise distribution", " or ".join(names))
    return None if value == NO_MICROBATCH_NOISE else value


def _microbatch_noise(origin: Origin, raw: object) -> MicrobatchNoise:
    """``{distribution: dropcompute-lognormal, delay_factor: 1}``, ``dropcompute-lognormal`` or ``none``."""
    if isinstance(raw, dict):
        section = Section(origin, raw, ("distribution", "delay_factor"))
        distribution = section.require("distribution", _distribution, " or ".join(MICROBATCH_DISTRIBUTIONS))
        delay = section.get("delay_factor", _delay_factor)
        if distribution is None:
            if delay:
                raise origin.at("delay_factor").error(
                    "a delay factor without a distribution",
                    value=raw["delay_factor"],
                    allowed=f"0 or left out with distribution {NO_MICROBATCH_NOISE}",
                )
            return MicrobatchNoise(None, 0.0)
        return MicrobatchNoise(distribution, 1.0 if delay is None else delay)
    distribution = parse_at(origin, raw, _distribution)
    return MicrobatchNoise(distribution, 0.0 if distribution is None else 1.0)


def parse_device_section(origin: Origin, raw: object, extra_keys: tuple[str, ...] = ()) -> DevicePatch:
    """Read one mapping of device settings."""
    section = Section(origin, raw, (*extra_keys, *DEVICE_KEYS))
    return DevicePatch(
        origin=origin,
        step_time_us=section.get("step_time", parse_positive_duration_us),
        slowdown=section.get("slowdown", parse_factor),
        straggler=_straggler(origin.at("straggler"), section.value("straggler"))
        if section.has("straggler")
        else None,
        noise_sigma=_noise(origin.at("noise"), section.value("noise")) if section.has("noise") else None,
        microbatch_noise=_microbatch_noise(origin.at("microbatch_noise"), section.value("microbatch_noise"))
        if section.has("microbatch_noise")
        else None,
    )


@dataclass(frozen=True)
class DeviceRule:
    """Settings for some nodes."""

    nodes: NodeSelector  # which nodes
    patch: DevicePatch  # their settings


@dataclass(frozen=True)
class DeviceModel:
    """Everything under ``devices:``."""

    origin: Origin  # the "devices" key
    seed: int = 0  # seeds the per-step straggler and noise draws
    default: DevicePatch | None = None  # every node
    nodes: tuple[DeviceRule, ...] = ()  # per-node overrides

    def selectors(self) -> list[NodeSelector]:
        """Every node selector written here."""
        return [rule.nodes for rule in self.nodes]

    def device(self, node: int, n: int) -> DeviceSpec:
        """The device of one node in a cluster of n."""
        rules = [rule for rule in self.nodes if node in rule.nodes.nodes(n)]
        if len(rules) > 1:
            raise rules[1].nodes.origin.error(
                f"node {node} is also in {rules[0].nodes.origin.key} (for {n} workers)",
                value=rules[1].nodes.text,
                allowed="each node in one devices.nodes entry at most; common settings go in devices.default",
            )
        step_time_us, slowdown, straggler, sigma = None, 1.0, Straggler(0.0, 1.0), 0.0
        microbatch = MicrobatchNoise(None, 0.0)
        for patch in (self.default, rules[0].patch if rules else None):
            if patch is None:
                continue
            step_time_us = patch.step_time_us if patch.step_time_us is not None else step_time_us
            slowdown = patch.slowdown if patch.slowdown is not None else slowdown
            straggler = patch.straggler or straggler
            sigma = patch.noise_sigma if patch.noise_sigma is not None else sigma
            microbatch = patch.microbatch_noise or microbatch
        return DeviceSpec(
            node=node,
            seed=self.seed,
            step_time_s=None if step_time_us is None else step_time_us / 1e6,
            slowdown=slowdown,
            straggler_probability=straggler.probability,
            straggler_factor=straggler.factor,
            noise_sigma=sigma,
            microbatch_noise=microbatch.distribution,
            microbatch_delay_factor=microbatch.delay_factor,
        )


def parse_devices(origin: Origin, raw: object) -> DeviceModel:
    """Read ``devices: {seed: 3, default: {...}, nodes: [{nodes: 3, slowdown: 3x}, ...]}``."""
    section = Section(origin, raw, ("seed", "default", "nodes"))
    default = (
        parse_device_section(origin.at("default"), section.value("default"))
        if section.has("default")
        else None
    )
    rules: list[DeviceRule] = []
    if section.has("nodes"):
        items = expect_list(
            origin.at("nodes"), section.value("nodes"), "{nodes: SELECTOR, slowdown: ...} entries"
        )
        for index, item in enumerate(items):
            entry = origin.at("nodes").at(index)
            patch = parse_device_section(entry, item, ("nodes",))
            assert isinstance(item, dict)
            if "nodes" not in item:
                raise entry.at("nodes").error("is required", allowed="a node selector")
            if len(item) == 1:
                raise entry.error("sets nothing", allowed=", ".join(DEVICE_KEYS))
            rules.append(DeviceRule(parse_selector(entry.at("nodes"), item["nodes"]), patch))
    seed = section.get("seed", lambda v: parse_int(v, 0)) or 0
    return DeviceModel(origin, seed, default, tuple(rules))
