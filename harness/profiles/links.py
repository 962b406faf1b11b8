"""Link sections: parsing ``links:`` (and each phase's ``links:``) into the rules of each scope.

Scopes from least to most specific: ``default``; ``inside`` a region / ``between`` two regions;
``nodes`` (the sender's ``egress``, the receiver's ``ingress``); ``pairs``. A more specific scope
replaces the settings it names, key by key (``delay``, ``jitter``, ``loss``, ``duplicate``,
``reorder``, ``rate``, ``limit``); a key is replaced as a whole (``loss: 5%`` drops a less specific
loss correlation). Within ``between`` and ``pairs`` a directed entry (``->``) beats a symmetric one
(``<->``); two entries of the same kind covering one link are an error, as is a node named by two
``nodes`` entries. When the sender's egress and the receiver's ingress both set a key, ``rate`` and
``limit`` take the smaller value (a packet crosses both); any other key is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from harness.profiles.errors import Origin, Section, expect_list, parse_at
from harness.profiles.model import Chance, Distribution, GilbertElliott, Jitter, Loss
from harness.profiles.regions import RegionSet
from harness.profiles.selectors import NodeSelector, PairExpr, parse_pair, parse_selector, split_arrow
from harness.profiles.units import (
    parse_duration_us,
    parse_packets,
    parse_percent,
    parse_rate_bps,
)

LINK_KEYS: Final = ("delay", "jitter", "loss", "duplicate", "reorder", "rate", "limit")
FIELD_OF_KEY: Final = {
    "delay": "delay_us",
    "jitter": "jitter",
    "loss": "loss",
    "duplicate": "duplicate",
    "reorder": "reorder",
    "rate": "rate_bps",
    "limit": "limit_packets",
}
KEY_OF_FIELD: Final = {field: key for key, field in FIELD_OF_KEY.items()}
MIN_FIELDS: Final = frozenset({"rate_bps", "limit_packets"})  # egress/ingress conflicts take the smaller
DISTRIBUTIONS: Final = ", ".join(d.value for d in Distribution)


@dataclass(frozen=True)
class LinkPatch:
    """One link section as written: only the keys it sets are not None."""

    origin: Origin  # the section's key path, e.g. links.pairs[2]
    delay_us: int | None = None  # one-way delay
    jitter: Jitter | None = None  # delay variation
    loss: Loss | None = None  # packet loss
    duplicate: Chance | None = None  # duplication
    reorder: Chance | None = None  # reordering
    rate_bps: int | None = None  # bandwidth
    limit_packets: int | None = None  # queue length

    def items(self) -> list[tuple[str, object]]:
        """The (LinkSpec field, value) pairs this section sets."""
        return [(f, getattr(self, f)) for f in KEY_OF_FIELD if getattr(self, f) is not None]


def _chance(origin: Origin, raw: object, what: str) -> Chance:
    """``5%`` or ``{percent: 5%, correlation: 25%}``."""
    if not isinstance(raw, dict):
        return Chance(parse_at(origin, raw, parse_percent))
    section = Section(origin, raw, ("percent", "correlation"))
    chance = Chance(
        section.get("percent", parse_percent) or 0.0, section.get("correlation", parse_percent) or 0.0
    )
    if chance.correlation_pct and not chance.percent:
        raise origin.at("correlation").error(
            f"{what} correlation without {what}",
            value=raw,
            allowed="set percent > 0% as well, or drop correlation",
        )
    return chance


def _jitter(origin: Origin, raw: object) -> Jitter:
    """``5ms`` or ``{amount: 5ms, distribution: normal, correlation: 25%}``."""
    if not isinstance(raw, dict):
        return Jitter(parse_at(origin, raw, parse_duration_us))
    section = Section(origin, raw, ("amount", "distribution", "correlation"))
    amount = section.require("amount", parse_duration_us, "a duration such as 5ms")
    distribution = Distribution.UNIFORM
    if section.has("distribution"):
        name = section.value("distribution")
        if name not in tuple(Distribution):
            raise origin.at("distribution").error("unknown distribution", value=name, allowed=DISTRIBUTIONS)
        distribution = Distribution(str(name))
    correlation = section.get("correlation", parse_percent) or 0.0
    if amount == 0 and (correlation or section.has("distribution")):
        raise origin.at("amount").error(
            "distribution or correlation without jitter", value=raw, allowed="an amount > 0, or drop them"
        )
    return Jitter(amount, distribution, correlation)


def _gemodel(origin: Origin, raw: object) -> GilbertElliott:
    """``{p: 1%, r: 25%, 1-h: 100%, 1-k: 0%}`` (1-h and 1-k optional)."""
    section = Section(origin, raw, ("p", "r", "1-h", "1-k"))
    model = GilbertElliott(
        p_pct=section.require("p", parse_percent, "a percentage"),
        r_pct=section.require("r", parse_percent, "a percentage"),
        loss_bad_pct=100.0 if (bad := section.get("1-h", parse_percent)) is None else bad,
        loss_good_pct=section.get("1-k", parse_percent) or 0.0,
    )
    if model.r_pct == 0 and model.p_pct > 0:
        raise origin.at("r").error("r = 0% never leaves the bad state", value=raw, allowed="r > 0%")
    return model


def _loss(origin: Origin, raw: object) -> Loss:
    """``1%``, ``{percent: 1%, correlation: 25%}`` or ``{gemodel: {...}}``."""
    if not isinstance(raw, dict):
        return Loss(parse_at(origin, raw, parse_percent))
    section = Section(origin, raw, ("percent", "correlation", "gemodel"))
    if section.has("gemodel"):
        if section.has("percent") or section.has("correlation"):
            raise origin.error(
                "gemodel and random loss together", value=raw, allowed="either percent/correlation or gemodel"
            )
        return Loss(gemodel=_gemodel(origin.at("gemodel"), section.value("gemodel")))
    chance = _chance(origin, raw, "loss")
    return Loss(chance.percent, chance.correlation_pct)


def parse_link_section(origin: Origin, raw: object, extra_keys: tuple[str, ...] = ()) -> LinkPatch:
    """Read one mapping of link settings (plus ``extra_keys`` that the caller reads itself)."""
    section = Section(origin, raw, (*extra_keys, *LINK_KEYS))

    def sub(key: str) -> Origin:
        return origin.at(key)

    return LinkPatch(
        origin=origin,
        delay_us=section.get("delay", parse_duration_us),
        jitter=_jitter(sub("jitter"), section.value("jitter")) if section.has("jitter") else None,
        loss=_loss(sub("loss"), section.value("loss")) if section.has("loss") else None,
        duplicate=_chance(sub("duplicate"), section.value("duplicate"), "duplicate")
        if section.has("duplicate")
        else None,
        reorder=_chance(sub("reorder"), section.value("reorder"), "reorder")
        if section.has("reorder")
        else None,
        rate_bps=section.get("rate", parse_rate_bps),
        limit_packets=section.get("limit", parse_packets),
    )


@dataclass(frozen=True)
class BetweenRule:
    """Links from one region to another (or both ways)."""

    origin: Origin  # links.between[i]
    src: str  # region the links leave (either, when symmetric)
    dst: str  # region the links enter (either, when symmetric)
    symmetric: bool  # written with <->
    patch: LinkPatch  # the settings


@dataclass(frozen=True)
class NodeRule:
    """Settings for every link leaving (egress) or entering (ingress) some nodes."""

    origin: Origin  # links.nodes[i]
    nodes: NodeSelector  # which nodes
    egress: LinkPatch | None  # applied to links src -> *, for src in nodes
    ingress: LinkPatch | None  # applied to links * -> dst, for dst in nodes
    uplink_bps: int | None  # total sending rate shared by all of the node's links
    downlink_bps: int | None  # total receiving rate shared by all of the node's links


@dataclass(frozen=True)
class PairRule:
    """Settings for the links of a pair expression."""

    expr: PairExpr  # which links
    patch: LinkPatch  # the settings


@dataclass(frozen=True)
class LinkRules:
    """One ``links:`` mapping (the base, or a phase's)."""

    origin: Origin  # "links" or "phases[i].links"
    default: LinkPatch | None = None  # every link
    inside: tuple[tuple[str, LinkPatch], ...] = ()  # (region, settings) for links within a region
    between: tuple[BetweenRule, ...] = ()  # links across regions
    nodes: tuple[NodeRule, ...] = ()  # per-node egress/ingress
    pairs: tuple[PairRule, ...] = ()  # per-pair

    def selectors(self) -> list[NodeSelector]:
        """Every node selector written in these rules (to check them against n)."""
        found = [rule.nodes for rule in self.nodes]
        for pair in self.pairs:
            found += [pair.expr.src, pair.expr.dst]
        return found


def _between(origin: Origin, raw: object, regions: RegionSet) -> BetweenRule:
    """One ``between`` entry: ``{link: "eu <-> us", delay: 40ms}``."""
    patch = parse_link_section(origin, raw, ("link",))
    assert isinstance(raw, dict)
    link_origin = origin.at("link")
    if "link" not in raw:
        raise link_origin.error("is required", allowed="'REGION -> REGION' or 'REGION <-> REGION'")
    src, symmetric, dst = split_arrow(link_origin, raw["link"])
    for name in (src, dst):
        regions.require(link_origin, name)
    if src == dst:
        raise link_origin.error("a region to itself", value=raw["link"], allowed=f"links.inside.{src}")
    return BetweenRule(origin, src, dst, symmetric, patch)


def _node_rule(origin: Origin, raw: object) -> NodeRule:
    """One ``nodes`` entry: ``{nodes: 3, egress: {...}, ingress: {...}, uplink: 20mbit}``."""
    section = Section(origin, raw, ("nodes", "egress", "ingress", "uplink", "downlink"))
    if not section.has("nodes"):
        raise origin.at("nodes").error("is required", allowed="a node selector")
    rule = NodeRule(
        origin=origin,
        nodes=parse_selector(origin.at("nodes"), section.value("nodes")),
        egress=parse_link_section(origin.at("egress"), section.value("egress"))
        if section.has("egress")
        else None,
        ingress=parse_link_section(origin.at("ingress"), section.value("ingress"))
        if section.has("ingress")
        else None,
        uplink_bps=section.get("uplink", parse_rate_bps),
        downlink_bps=section.get("downlink", parse_rate_bps),
    )
    if len(section.raw) == 1:
        raise origin.error("sets nothing", allowed="egress, ingress, uplink or downlink next to nodes")
    return rule


def _pair(origin: Origin, raw: object) -> PairRule:
    """One ``pairs`` entry: ``{link: "0 -> 1", delay: 10ms}``."""
    patch = parse_link_section(origin, raw, ("link",))
    assert isinstance(raw, dict)
    if "link" not in raw:
        raise origin.at("link").error("is required", allowed="'A -> B' or 'A <-> B' with node selectors")
    return PairRule(parse_pair(origin.at("link"), raw["link"]), patch)


def _no_duplicates(origin: Origin, keys: list[tuple[object, ...]], what: str) -> None:
    """Reject two entries of a list that name the same links."""
    seen: dict[tuple[object, ...], int] = {}
    for index, key in enumerate(keys):
        if key in seen:
            raise (
                origin.at(index)
                .at("link")
                .error(f"the same {what} as {origin.at(seen[key]).key}", allowed=f"each {what} once")
            )
        seen[key] = index


def parse_links(origin: Origin, raw: object, regions: RegionSet) -> LinkRules:
    """Read a ``links:`` mapping."""
    section = Section(origin, raw, ("default", "inside", "between", "nodes", "pairs"))
    default = (
        parse_link_section(origin.at("default"), section.value("default")) if section.has("default") else None
    )
    inside: list[tuple[str, LinkPatch]] = []
    if section.has("inside"):
        inside_origin = origin.at("inside")
        inside_raw = Section(inside_origin, section.value("inside"), regions.names).raw
        inside = [
            (str(name), parse_link_section(inside_origin.at(str(name)), v)) for name, v in inside_raw.items()
        ]

    def entries(key: str, what: str) -> list[tuple[Origin, object]]:
        if not section.has(key):
            return []
        items = expect_list(origin.at(key), section.value(key), what)
        return [(origin.at(key).at(i), item) for i, item in enumerate(items)]

    between = [_between(o, item, regions) for o, item in entries("between", "{link: 'A <-> B', ...} entries")]
    _no_duplicates(
        origin.at("between"),
        [(r.symmetric, *(sorted([r.src, r.dst]) if r.symmetric else [r.src, r.dst])) for r in between],
        "region link",
    )
    nodes = [_node_rule(o, item) for o, item in entries("nodes", "{nodes: SELECTOR, egress: ...} entries")]
    pairs = [_pair(o, item) for o, item in entries("pairs", "{link: 'A -> B', ...} entries")]
    _no_duplicates(origin.at("pairs"), [p.expr.canonical() for p in pairs], "pair")
    return LinkRules(origin, default, tuple(inside), tuple(between), tuple(nodes), tuple(pairs))
