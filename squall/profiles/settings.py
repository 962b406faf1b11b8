"""Every link setting, declared once: one row per :class:`~squall.profiles.model.LinkSpec` field.

A row says everything the harness needs to know about one setting:

* **profile**: the key a ``links:`` section accepts, the parser that reads it, what it accepts,
  and whether a sender's egress and a receiver's ingress may both set it (``narrowest``: the
  smaller value wins, a packet crosses both), read by :mod:`.links` and :mod:`.resolve`;
* **unit and bounds**: the canonical unit of the value (``unit``), the one every layer carries:
  a profile's ``1%`` is read as 0.01, the shaping plans hold 0.01, and each backend translates it
  once, where it writes it (netem's netlink encoding, ``squall.shaping.netem.wire``; the delay
  daemon's configuration, ``squall.shaping.nfqueue.config``; HTB's bytes per second in
  ``squall.shaping.kernel.tc``). ``check`` applies the bounds to a hand-built value
  (``squall.shaping.planning.checks.check_spec``); the **neutral** value is the LinkSpec default;
* **shaping**: on each backend the carrier (the plan operation that applies it, and the attributes
  of that operation's value that hold it) and the parts the backend refuses. The backends derive
  from it which settings a netem leaf and the delay daemon carry, and the refusals;
* **calibration**: whether it stays on while rates are measured (``calm``, see :func:`calm`).

The rules between the parts of one link (a correlation needs its chance, reordering needs a delay,
one loss model at a time, a Gilbert-Elliott chain that moves) are declared once, in
:mod:`.link_rules`, and every place that checks a link uses them: a profile as it is read, a
hand-built LinkSpec (:func:`problem`) and the delay daemon's configuration.

Adding a setting is a LinkSpec field plus a row here (and a translator in each backend's plan for
the carrier it names); ``tests/unit/test_profiles_settings.py`` fails until each backend either
carries the new field or refuses it with an error naming it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from squall.profiles.bounds import (
    DELAY_RANGE,
    JITTER_RANGE,
    LIMIT_RANGE,
    MAX_DELAY_US,
    MAX_JITTER_US,
    MAX_LIMIT_PACKETS,
    MAX_RATE_BPS,
    MIN_RATE_BPS,
    RATE_RANGE,
    is_correlation,
    is_probability,
    parse_delay_us,
    parse_limit_packets,
    parse_link_rate_bps,
)
from squall.profiles.errors import Origin, parse_at
from squall.profiles.link_rules import GEMODEL_PARTS, gemodel_moves, one_loss_model, reorder_has_delay
from squall.profiles.link_values import parse_chance, parse_jitter, parse_loss
from squall.profiles.model import Jitter, LinkSpec, Loss
from squall.profiles.units import DURATION_ALLOWED, PACKETS_ALLOWED, RATE_ALLOWED

PERFECT: Final = LinkSpec()

Parser = Callable[[Origin, object], Any]  # (where it was written, raw YAML value) -> model value
Checker = Callable[[Any], "str | None"]  # hand-built value -> why it is out of bounds, None when fine


class Carrier(enum.StrEnum):
    """What applies a setting on one backend: the operation of the shaping plan that carries it."""

    NETEM = "netem"  # "an attribute of the link's netem leaf (QdiscOp holding a Netem)"
    HTB = "htb"  # "the rate and ceil of the link's HTB class in the sender (ClassOp)"
    QUEUE_LIMIT = "queue_limit"  # "the length of the queue the link's other settings create; alone it sizes nothing"
    DAEMON = "daemon"  # "a parameter of the delay daemon's queue for the link (QueueOp's LinkParams)"
    TEE = "tee"  # "an iptables TEE rule with a random statistic match in the sender (RuleOp)"


@dataclass(frozen=True)
class Refusal:
    """A part of a setting one backend cannot apply: planning raises instead of dropping it."""

    what: str  # the part, starting with the profile key, e.g. "duplicate correlation"
    when: Callable[[LinkSpec], bool]  # whether a link asks for that part
    why: str  # the backend's reason
    instead: str  # what the user can do about it

    def message(self, backend: str, where: str) -> str:
        """The ShapingError text for link ``where``."""
        return f"{where}: {self.what} is not supported by the {backend} backend ({self.why}); {self.instead}"


@dataclass(frozen=True)
class Treatment:
    """How one backend applies one setting."""

    carrier: Carrier  # the plan operation that applies it
    attrs: tuple[str, ...]  # "Type.attribute" of the plan values that hold it, e.g. "Netem.delay_us"
    refuses: tuple[Refusal, ...] = ()  # parts this backend rejects at planning time


@dataclass(frozen=True)
class LinkSetting:
    """One link setting: its profile key, value, bounds and what each backend does with it."""

    field: str  # the LinkSpec field
    key: str  # the key in a links section (links.default.delay, links.pairs[0].rate, ...)
    parse: Parser  # reads the key's value; raises ProfileError naming the key and what is allowed
    accepts: str  # what the key accepts, for documentation
    unit: str  # the canonical unit of the value, carried from the profile to where a backend writes it
    check: Checker  # bounds of a hand-built value (profiles guarantee them through ``parse``)
    narrowest: bool  # egress and ingress may both set it: the smaller value wins
    calm: bool  # stays on while calibration measures rates (the others are switched off)
    netem: Treatment  # on the netem backend
    nfqueue: Treatment  # on the nfqueue backend

    @property
    def neutral(self) -> object:
        """The value that changes nothing: the LinkSpec default (a perfect link)."""
        return getattr(PERFECT, self.field)

    def value(self, spec: LinkSpec) -> Any:
        """This setting's value in ``spec``."""
        return getattr(spec, self.field)

    def is_set(self, spec: LinkSpec) -> bool:
        """Whether ``spec`` sets it to anything but its neutral value."""
        return bool(self.value(spec) != self.neutral)

    def on(self, backend: str) -> Treatment:
        """How ``backend`` ("netem" or "nfqueue") applies it."""
        if backend not in ("netem", "nfqueue"):
            raise ValueError(f"unknown backend {backend!r}; allowed: netem, nfqueue")
        treatment: Treatment = getattr(self, backend)
        return treatment


# ----------------------------------------------------------------------------- parsers and bounds


def _unit(parse: Callable[[object], Any]) -> Parser:
    """A one-number setting: a unit parser whose UnitError becomes a ProfileError at the key."""
    return lambda origin, raw: parse_at(origin, raw, parse)


def _chance_of(what: str) -> Parser:
    return lambda origin, raw: parse_chance(origin, raw, what)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p), None)


def _prob(name: str, value: object) -> str | None:
    return None if is_probability(value) else f"{name} must be a probability in [0, 1], got {value!r}"


def _corr(name: str, value: object) -> str | None:
    return None if is_correlation(value) else f"{name} correlation must be in [0, 1), got {value!r}"


def _check_delay(value: object) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_DELAY_US
    return None if ok else f"delay_us must be an integer >= 0 and <= {MAX_DELAY_US}, got {value!r} ({DELAY_RANGE})"


def _check_jitter(jitter: Jitter) -> str | None:
    ok = _is_int(jitter.amount_us) and 0 <= jitter.amount_us <= MAX_JITTER_US
    return _first(
        None if ok else f"jitter must be an integer >= 0 and <= {MAX_JITTER_US}, got {jitter.amount_us!r} "
        f"({JITTER_RANGE})",
        _corr("jitter", jitter.correlation),
    )


def _check_loss(loss: Loss) -> str | None:
    problem = _first(_prob("loss", loss.probability), _corr("loss", loss.correlation))
    ge = loss.gemodel
    if problem or ge is None:
        return problem
    if not one_loss_model(loss.probability, ge):
        return "loss probability and gemodel are two loss models; give one"
    return _first(*(_prob(f"gemodel {name}", getattr(ge, name)) for name in GEMODEL_PARTS),
                  None if gemodel_moves(ge.p, ge.r) else "gemodel needs p + r > 0")


def _check_chance(name: str) -> Checker:
    return lambda chance: _first(_prob(name, chance.probability), _corr(name, chance.correlation))


def _check_rate(value: object) -> str | None:
    ok = value is None or (
        isinstance(value, int) and not isinstance(value, bool) and MIN_RATE_BPS <= value <= MAX_RATE_BPS
    )
    return None if ok else (
        f"bad rate_bps {value!r}: an integer >= {MIN_RATE_BPS} and <= {MAX_RATE_BPS} bits/s, or None ({RATE_RANGE})"
    )


def _check_limit(value: object) -> str | None:
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_LIMIT_PACKETS)
    return None if ok else (
        f"bad limit_packets {value!r}: an integer in [1, {MAX_LIMIT_PACKETS}], or None ({LIMIT_RANGE})"
    )


def _sizes_a_daemon_queue(spec: LinkSpec) -> bool:
    """A limit on a link without a rate that has something else to do (a limit alone sizes nothing)."""
    return spec.limit_packets is not None and spec.rate_bps is None and (
        dataclasses.replace(spec, limit_packets=None).impaired
    )


# ----------------------------------------------------------------------------- the table

CHANCE_UNIT: Final = "probability: a fraction in [0, 1]; correlation: a fraction in [0, 1)"

SETTINGS: Final[tuple[LinkSetting, ...]] = (
    LinkSetting(
        field="delay_us", key="delay", parse=_unit(parse_delay_us), accepts=f"{DURATION_ALLOWED}; {DELAY_RANGE}",
        unit="integer microseconds",
        check=_check_delay, narrowest=False, calm=True,  # transfers see the real round trip
        netem=Treatment(Carrier.NETEM, ("Netem.delay_us",)),
        nfqueue=Treatment(Carrier.DAEMON, ("LinkParams.delay_us",)),
    ),
    LinkSetting(
        field="jitter", key="jitter", parse=parse_jitter,
        accepts=f"a duration (5ms) or {{amount: 5ms, distribution: normal, correlation: 25%}}; {JITTER_RANGE}",
        unit="amount: integer microseconds; correlation: a fraction in [0, 1)",
        check=_check_jitter, narrowest=False, calm=False,
        netem=Treatment(Carrier.NETEM, ("Netem.jitter_us", "Netem.distribution", "Netem.delay_corr")),
        nfqueue=Treatment(
            Carrier.DAEMON, ("LinkParams.jitter_us", "LinkParams.distribution", "LinkParams.jitter_correlation")
        ),
    ),
    LinkSetting(
        field="loss", key="loss", parse=parse_loss,
        accepts="a percentage (1%), {percent: 1%, correlation: 25%} or {gemodel: {p: 1%, r: 25%, 1-h: 100%, 1-k: 0%}}",
        unit=f"{CHANCE_UNIT}; gemodel p, r, 1-h, 1-k: fractions in [0, 1]",
        check=_check_loss, narrowest=False, calm=False,  # TCP cannot fill a lossy pipe
        netem=Treatment(Carrier.NETEM, ("Netem.loss", "Netem.loss_corr", "Netem.gemodel")),
        nfqueue=Treatment(
            Carrier.DAEMON, ("LinkParams.loss", "LinkParams.loss_correlation", "LinkParams.gilbert_elliott")
        ),
    ),
    LinkSetting(
        field="duplicate", key="duplicate", parse=_chance_of("duplicate"),
        accepts="a percentage (1%) or {percent: 1%, correlation: 25%}",
        unit=CHANCE_UNIT,
        check=_check_chance("duplicate"), narrowest=False, calm=False,
        netem=Treatment(Carrier.NETEM, ("Netem.duplicate", "Netem.duplicate_corr")),
        nfqueue=Treatment(
            Carrier.TEE,
            ("RuleOp.probability",),
            refuses=(
                Refusal(
                    "duplicate correlation",
                    lambda spec: spec.duplicate.probability > 0 and spec.duplicate.correlation > 0,
                    "iptables statistic draws each packet independently",
                    "use netem or drop the correlation",
                ),
            ),
        ),
    ),
    LinkSetting(
        field="reorder", key="reorder", parse=_chance_of("reorder"),
        accepts="a percentage (1%) or {percent: 1%, correlation: 25%}; needs a delay",
        unit=CHANCE_UNIT,
        check=_check_chance("reorder"), narrowest=False, calm=False,
        netem=Treatment(Carrier.NETEM, ("Netem.reorder", "Netem.reorder_corr")),
        nfqueue=Treatment(Carrier.DAEMON, ("LinkParams.reorder", "LinkParams.reorder_correlation")),
    ),
    LinkSetting(
        field="rate_bps", key="rate", parse=_unit(parse_link_rate_bps), accepts=f"{RATE_ALLOWED}; {RATE_RANGE}",
        unit="integer bits per second (tc's executor hands pyroute2 bytes per second)",
        check=_check_rate, narrowest=True, calm=True,  # what the transfers measure
        netem=Treatment(Carrier.HTB, ("ClassOp.rate_bps", "ClassOp.ceil_bps")),
        nfqueue=Treatment(Carrier.HTB, ("ClassOp.rate_bps", "ClassOp.ceil_bps")),
    ),
    LinkSetting(
        field="limit_packets", key="limit", parse=_unit(parse_limit_packets),
        accepts=f"{PACKETS_ALLOWED}; {LIMIT_RANGE}",
        unit="whole packets",
        check=_check_limit, narrowest=True, calm=True,  # the bottleneck buffer shapes a transfer
        netem=Treatment(Carrier.QUEUE_LIMIT, ("Netem.limit",)),
        nfqueue=Treatment(
            Carrier.QUEUE_LIMIT,
            ("Pfifo.limit",),
            refuses=(
                Refusal(
                    "limit without a rate",
                    _sizes_a_daemon_queue,
                    "only the FIFO in front of a rate takes a limit; the delay daemon's queue is sized per run",
                    "give the link a rate as well, or use netem",
                ),
            ),
        ),
    ),
)

BY_FIELD: Final = {setting.field: setting for setting in SETTINGS}
BY_KEY: Final = {setting.key: setting for setting in SETTINGS}
LINK_KEYS: Final = tuple(BY_KEY)  # the keys of a links section, in table order


def carried_by(backend: str, *carriers: Carrier) -> tuple[LinkSetting, ...]:
    """The settings that ``backend`` applies through one of ``carriers``."""
    return tuple(s for s in SETTINGS if s.on(backend).carrier in carriers)


def refusals(spec: LinkSpec, backend: str) -> list[Refusal]:
    """What ``backend`` cannot apply of ``spec`` (empty when it applies all of it)."""
    return [r for s in SETTINGS for r in s.on(backend).refuses if r.when(spec)]


def out_of_bounds(spec: LinkSpec) -> str | None:
    """The first setting of a hand-built ``spec`` outside its bounds, as a message; None when all are in."""
    return _first(*(s.check(s.value(spec)) for s in SETTINGS))


def problem(spec: LinkSpec) -> str | None:
    """What no backend can apply in a hand-built ``spec``: a setting out of bounds, or reordering without
    a delay; None when it is fine. Profiles check the same as they are read."""
    return _first(out_of_bounds(spec), None if reorder_has_delay(spec.reorder.probability, spec.delay_us)
                  else "reorder needs a delay (packets skip it)")


def calm(spec: LinkSpec, *, drop: frozenset[str] = frozenset()) -> LinkSpec:
    """A perfect link that keeps only ``spec``'s ``calm`` settings (a whitelist), less the fields in ``drop``.

    Calibration measures rates with TCP transfers, which cannot fill a link that drops, jitters,
    duplicates or reorders; everything not ``calm`` goes back to neutral, so a setting added later
    is off during the transfers unless its row says it must stay.
    """
    unknown = drop - BY_FIELD.keys()
    if unknown:
        raise ValueError(f"drop names {sorted(unknown)}, not LinkSpec fields; allowed: {', '.join(BY_FIELD)}")
    kept = {s.field: s.value(spec) for s in SETTINGS if s.calm and s.field not in drop}
    return dataclasses.replace(PERFECT, **kept)

