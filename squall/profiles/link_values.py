"""Parsers of the link settings whose values are more than one number: jitter, loss, duplicate, reorder.

Each takes the value's origin (its key path, for errors) and the raw YAML value, and returns the
model value in its canonical units (percentages become fractions: ``5%`` is 0.05) or raises
:class:`~squall.profiles.errors.ProfileError` naming the key and what is allowed. The one-number
settings use the unit parsers of :mod:`.units` directly; which parser reads which key is declared
in :mod:`.settings`, and so are the rules between the parts of a value.
"""

from __future__ import annotations

from typing import Final

from squall.profiles.bounds import parse_correlation, parse_jitter_us
from squall.profiles.errors import Origin, Section, parse_at
from squall.profiles.link_rules import correlated_only_if_set, gemodel_moves
from squall.profiles.model import Chance, Distribution, GilbertElliott, Jitter, Loss
from squall.profiles.units import parse_probability

DISTRIBUTIONS: Final = ", ".join(d.value for d in Distribution)


def parse_chance(origin: Origin, raw: object, what: str) -> Chance:
    """``5%`` or ``{percent: 5%, correlation: 25%}``."""
    if not isinstance(raw, dict):
        return Chance(parse_at(origin, raw, parse_probability))
    section = Section(origin, raw, ("percent", "correlation"))
    chance = Chance(
        section.get("percent", parse_probability) or 0.0, section.get("correlation", parse_correlation) or 0.0
    )
    if not correlated_only_if_set(chance.probability, chance.correlation):
        raise origin.at("correlation").error(
            f"{what} correlation without {what}",
            value=raw,
            allowed="set percent > 0% as well, or drop correlation",
        )
    return chance


def parse_jitter(origin: Origin, raw: object) -> Jitter:
    """``5ms`` or ``{amount: 5ms, distribution: normal, correlation: 25%}``."""
    if not isinstance(raw, dict):
        return Jitter(parse_at(origin, raw, parse_jitter_us))
    section = Section(origin, raw, ("amount", "distribution", "correlation"))
    amount = section.require("amount", parse_jitter_us, "a duration such as 5ms")
    distribution = Distribution.UNIFORM
    if section.has("distribution"):
        name = section.value("distribution")
        if name not in tuple(Distribution):
            raise origin.at("distribution").error("unknown distribution", value=name, allowed=DISTRIBUTIONS)
        distribution = Distribution(str(name))
    correlation = section.get("correlation", parse_correlation) or 0.0
    if not correlated_only_if_set(amount, correlation) or (amount == 0 and section.has("distribution")):
        raise origin.at("amount").error(
            "distribution or correlation without jitter", value=raw, allowed="an amount > 0, or drop them"
        )
    return Jitter(amount, distribution, correlation)


def parse_gemodel(origin: Origin, raw: object) -> GilbertElliott:
    """``{p: 1%, r: 25%, 1-h: 100%, 1-k: 0%}`` (1-h and 1-k optional)."""
    section = Section(origin, raw, ("p", "r", "1-h", "1-k"))
    model = GilbertElliott(
        p=section.require("p", parse_probability, "a percentage"),
        r=section.require("r", parse_probability, "a percentage"),
        loss_bad=1.0 if (bad := section.get("1-h", parse_probability)) is None else bad,
        loss_good=section.get("1-k", parse_probability) or 0.0,
    )
    if model.r == 0 and model.p > 0:
        raise origin.at("r").error("r = 0% never leaves the bad state", value=raw, allowed="r > 0%")
    if not gemodel_moves(model.p, model.r):
        raise origin.at("r").error("p = r = 0% never moves between the states", value=raw, allowed="r > 0%")
    return model


def parse_loss(origin: Origin, raw: object) -> Loss:
    """``1%``, ``{percent: 1%, correlation: 25%}`` or ``{gemodel: {...}}``."""
    if not isinstance(raw, dict):
        return Loss(parse_at(origin, raw, parse_probability))
    section = Section(origin, raw, ("percent", "correlation", "gemodel"))
    if section.has("gemodel"):
        if section.has("percent") or section.has("correlation"):
            raise origin.error(
                "gemodel and random loss together", value=raw, allowed="either percent/correlation or gemodel"
            )
        return Loss(gemodel=parse_gemodel(origin.at("gemodel"), section.value("gemodel")))
    chance = parse_chance(origin, raw, "loss")
    return Loss(chance.probability, chance.correlation)
