"""Link sections: parsing ``links:`` (and each phase's ``links:``) into the rules of each scope.

Scopes from least to most specific: ``default``; ``inside`` a region / ``between`` two regions;
``nodes`` (the sender's ``egress``, the receiver's ``ingress``); ``pairs``. A more specific scope
replaces the settings it names, key by key (the keys of :data:`~.settings.SETTINGS`: ``delay``,
``jitter``, ``loss``, ``duplicate``, ``reorder``, ``rate``, ``limit``); a key is replaced as a
whole (``loss: 5%`` drops a less specific loss correlation). Within ``between`` and ``pairs`` a
directed entry (``->``) beats a symmetric one (``<->``); two entries of the same kind covering one
link are an error, as is a node named by two ``nodes`` entries. When the sender's egress and the
receiver's ingress both set a key, the ``narrowest`` ones (``rate``, ``limit``) take the smaller
value (a packet crosses both); any other key is an error.

A ``nodes`` entry also describes the nodes' access to the network: ``uplink`` and ``downlink``
(everything a node sends or receives, shared by all its links), fixed or replayed from a trace
whose columns are ``uplink`` and ``downlink`` (:data:`~.link_traces.ACCESS_COLUMNS`), and ``nat``
(:func:`parse_nat`): the nodes sit behind NAT, each behind its own (``true``) or all the nodes of
a named site behind one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from squall.profiles.bounds import parse_link_rate_bps
from squall.profiles.errors import Origin, Section, expect_list
from squall.profiles.link_traces import ACCESS_COLUMNS, ACCESS_KEYS, Trace, load_trace
from squall.profiles.regions import RegionSet
from squall.profiles.selectors import NodeSelector, PairExpr, parse_pair, parse_selector, split_arrow
from squall.profiles.settings import BY_FIELD, LINK_KEYS, SETTINGS

KEY_OF_FIELD: Final = {field: setting.key for field, setting in BY_FIELD.items()}
MIN_FIELDS: Final = frozenset(s.field for s in SETTINGS if s.narrowest)  # egress/ingress conflicts take the smaller
TRACE_KEY: Final = "trace"  # a link scope's trace file, beside or instead of fixed settings
NAT_KEY: Final = "nat"  # a nodes entry: its nodes sit behind NAT
OWN_NAT: Final = ""  # NodeRule.nat of ``nat: true``: every node behind a NAT of its own
_SITE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
NAT_ALLOWED: Final = ("true (each node behind a NAT of its own), false, or a site name (lower-case letters, digits, "
                      "- and _, starting with a letter, at most 32 characters) shared by the nodes behind one NAT")


@dataclass(frozen=True)
class LinkPatch:
    """One link section as written: the settings it names, in table order."""

    origin: Origin  # the section's key path, e.g. links.pairs[2]
    values: tuple[tuple[str, object], ...] = ()  # (LinkSpec field, parsed value) for each key written
    trace: Trace | None = None  # a trace whose row in force sets its columns on top of ``values``

    def items(self, at_us: int = 0) -> list[tuple[str, object]]:
        """The (LinkSpec field, value) pairs this section sets ``at_us`` after its trace started."""
        if self.trace is None:
            return list(self.values)
        return [*self.values, *self.trace.values_at(at_us)]

    def origin_of(self, field: str) -> Origin:
        """Where ``field`` was set: its key, or the trace's key when the trace sets it."""
        if self.trace is not None and field in self.trace.fields:
            return self.origin.at(TRACE_KEY)
        return self.origin.at(KEY_OF_FIELD[field])


def parse_link_section(origin: Origin, raw: object, extra_keys: tuple[str, ...] = ()) -> LinkPatch:
    """Read one mapping of link settings (plus ``extra_keys`` that the caller reads itself).

    ``trace:`` names a trace file (:mod:`.traces`) whose columns change over time; a key written
    beside it must not be one of its columns (which would win is not obvious).
    """
    section = Section(origin, raw, (*extra_keys, *LINK_KEYS, TRACE_KEY))
    values = tuple(
        (s.field, s.parse(origin.at(s.key), section.value(s.key))) for s in SETTINGS if section.has(s.key)
    )
    trace = load_trace(origin.at(TRACE_KEY), section.value(TRACE_KEY)) if section.has(TRACE_KEY) else None
    if trace is not None:
        for column in trace.columns:
            if section.has(column):
                raise origin.at(column).error(
                    f"is also a column of the trace {trace.file}", value=section.value(column),
                    allowed="each setting either fixed here or in the trace")
    return LinkPatch(origin, values, trace)


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
    access: LinkPatch | None = None  # a trace of uplink/downlink (columns of ACCESS_COLUMNS), at this entry's key
    nat: str | None = None  # behind NAT: OWN_NAT (each node its own) or the site's name; None: reachable

    def access_at(self, at_us: int) -> tuple[int | None, int | None]:
        """(uplink, downlink) in bits/s ``at_us`` after the rules started: the trace's row over the fixed keys."""
        values = dict(self.access.items(at_us)) if self.access is not None else {}
        uplink = values.get("uplink_bps", self.uplink_bps)
        downlink = values.get("downlink_bps", self.downlink_bps)
        assert uplink is None or isinstance(uplink, int)
        assert downlink is None or isinstance(downlink, int)
        return uplink, downlink


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

    def patches(self) -> list[LinkPatch]:
        """Every link section of these rules, in scope order."""
        found = [self.default] if self.default else []
        found += [patch for _, patch in self.inside]
        found += [rule.patch for rule in self.between]
        for rule in self.nodes:
            found += [p for p in (rule.egress, rule.ingress, rule.access) if p is not None]
        return found + [rule.patch for rule in self.pairs]

    def traces(self) -> list[LinkPatch]:
        """The link sections that replay a trace."""
        return [patch for patch in self.patches() if patch.trace is not None]

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


def parse_nat(origin: Origin, raw: object) -> str | None:
    """``nat: true`` (:data:`OWN_NAT`), ``false`` (None) or a site's name, as :class:`NodeRule` holds it."""
    if raw is True:
        return OWN_NAT
    if raw is False:
        return None
    if isinstance(raw, str) and _SITE.match(raw) and raw not in ("true", "false", "yes", "no", "on", "off"):
        return raw
    raise origin.error("is not a NAT setting", value=raw, allowed=NAT_ALLOWED)


def _access_trace(origin: Origin, section: Section) -> LinkPatch | None:
    """A nodes entry's ``trace:`` of its access link; a key written beside it must not be one of its columns."""
    if not section.has(TRACE_KEY):
        return None
    trace = load_trace(origin.at(TRACE_KEY), section.value(TRACE_KEY), ACCESS_COLUMNS)
    for column in trace.columns:
        if section.has(column):
            raise origin.at(column).error(
                f"is also a column of the trace {trace.file}", value=section.value(column),
                allowed="each of uplink and downlink either fixed here or in the trace")
    return LinkPatch(origin, (), trace)


def _node_rule(origin: Origin, raw: object, *, in_phase: bool = False) -> NodeRule:
    """One ``nodes`` entry: ``{nodes: 3, egress: {...}, ingress: {...}, uplink: 20mbit, nat: true}``."""
    section = Section(origin, raw, ("nodes", "egress", "ingress", *ACCESS_KEYS, TRACE_KEY, NAT_KEY))
    if not section.has("nodes"):
        raise origin.at("nodes").error("is required", allowed="a node selector")
    nat = parse_nat(origin.at(NAT_KEY), section.value(NAT_KEY)) if section.has(NAT_KEY) else None
    if in_phase and section.has(NAT_KEY):
        raise origin.at(NAT_KEY).error("a node's NAT holds for the whole run", value=section.value(NAT_KEY),
                                       allowed="nat in the top-level links.nodes only")
    rule = NodeRule(
        origin=origin,
        nodes=parse_selector(origin.at("nodes"), section.value("nodes")),
        egress=parse_link_section(origin.at("egress"), section.value("egress"))
        if section.has("egress")
        else None,
        ingress=parse_link_section(origin.at("ingress"), section.value("ingress"))
        if section.has("ingress")
        else None,
        uplink_bps=section.get("uplink", parse_link_rate_bps),
        downlink_bps=section.get("downlink", parse_link_rate_bps),
        access=_access_trace(origin, section),
        nat=nat,
    )
    if len(section.raw) == 1:
        raise origin.error("sets nothing", allowed="egress, ingress, uplink, downlink, trace or nat next to nodes")
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


def parse_links(origin: Origin, raw: object, regions: RegionSet, *, in_phase: bool = False) -> LinkRules:
    """Read a ``links:`` mapping (``in_phase``: a phase's, where ``nat`` is refused)."""
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
    nodes = [_node_rule(o, item, in_phase=in_phase)
             for o, item in entries("nodes", "{nodes: SELECTOR, egress: ...} entries")]
    pairs = [_pair(o, item) for o, item in entries("pairs", "{link: 'A -> B', ...} entries")]
    _no_duplicates(origin.at("pairs"), [p.expr.canonical() for p in pairs], "pair")
    return LinkRules(origin, default, tuple(inside), tuple(between), tuple(nodes), tuple(pairs))
