"""Resolving one directed link: applying link sections scope by scope, then checking the result.

The precedence rules are described in ``links.py`` and ``netem_profiles/README.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from squall.profiles.errors import Origin
from squall.profiles.link_rules import reorder_has_delay
from squall.profiles.links import KEY_OF_FIELD, MIN_FIELDS, LinkPatch, LinkRules, NodeRule
from squall.profiles.model import LinkSpec
from squall.profiles.regions import RegionSet
from squall.profiles.units import format_duration_us, format_probability


class Resolver:
    """Accumulates link sections for one directed link, most specific last."""

    def __init__(self, src: int, dst: int, n: int) -> None:
        self.src, self.dst, self.n = src, dst, n
        self.at_us = 0  # time since the rules being applied started (their traces' clock)
        self.values: dict[str, object] = {}  # LinkSpec field -> value
        self.origins: dict[str, Origin] = {}  # LinkSpec field -> where it was set

    @property
    def label(self) -> str:
        """The link, for messages."""
        return f"{self.src}->{self.dst}"

    def apply(self, patch: LinkPatch | None) -> None:
        """Let a section override what it sets."""
        if patch is None:
            return
        for field, value in patch.items(self.at_us):
            self.values[field] = value
            self.origins[field] = patch.origin_of(field)

    def apply_ends(self, egress: LinkPatch | None, ingress: LinkPatch | None) -> None:
        """Apply the sender's egress and the receiver's ingress, which are equally specific."""
        if egress is None or ingress is None:
            self.apply(egress or ingress)
            return
        self.apply(egress)
        egress_fields = dict(egress.items(self.at_us))
        for field, value in ingress.items(self.at_us):
            key = KEY_OF_FIELD[field]
            if field in egress_fields and field not in MIN_FIELDS:
                raise ingress.origin.at(key).error(
                    f"conflicts with {egress.origin.at(key).key} on link {self.label}",
                    value=value,
                    allowed=f"{key} in only one of them, or in links.pairs for this link",
                )
            previous = egress_fields.get(field)
            if isinstance(previous, int) and isinstance(value, int) and previous <= value:
                continue
            self.values[field] = value
            self.origins[field] = ingress.origin_of(field)

    def apply_rules(self, rules: LinkRules, regions: RegionSet, at_us: int = 0) -> None:
        """Apply one ``links:`` mapping, scope by scope, ``at_us`` after it started (for its traces)."""
        self.at_us = at_us
        self.apply(rules.default)
        region_of = regions.region_of(self.n)
        src_region, dst_region = region_of.get(self.src), region_of.get(self.dst)
        if src_region is not None and src_region == dst_region:
            self.apply(dict(rules.inside).get(src_region))
        elif src_region is not None and dst_region is not None:
            self._apply_between(rules, src_region, dst_region)
        egress = [r for r in rules.nodes if self.src in r.nodes.nodes(self.n) and r.egress]
        ingress = [r for r in rules.nodes if self.dst in r.nodes.nodes(self.n) and r.ingress]
        self.apply_ends(egress[0].egress if egress else None, ingress[0].ingress if ingress else None)
        self._apply_pairs(rules)

    def _apply_between(self, rules: LinkRules, src_region: str, dst_region: str) -> None:
        """Region-to-region rules: symmetric first, then directed."""
        for symmetric in (True, False):
            hits = [
                rule
                for rule in rules.between
                if rule.symmetric == symmetric
                and (
                    (rule.src, rule.dst) == (src_region, dst_region)
                    or (symmetric and (rule.dst, rule.src) == (src_region, dst_region))
                )
            ]
            self.apply(hits[0].patch if hits else None)

    def _apply_pairs(self, rules: LinkRules) -> None:
        """Pair rules: symmetric first, then directed; two of a kind on one link is an error."""
        for symmetric in (True, False):
            hits = [
                rule
                for rule in rules.pairs
                if rule.expr.symmetric == symmetric and rule.expr.covers(self.src, self.dst, self.n)
            ]
            if len(hits) > 1:
                raise hits[1].expr.origin.error(
                    f"covers link {self.label} like {hits[0].expr.origin.key} does",
                    value=hits[1].expr.text,
                    allowed="at most one '->' and one '<->' entry per link",
                )
            self.apply(hits[0].patch if hits else None)

    def build(self) -> LinkSpec:
        """The effective link spec."""
        return dataclasses.replace(LinkSpec(), **cast("dict[str, Any]", self.values))


def check_link(spec: LinkSpec, resolver: Resolver) -> list[str]:
    """Reject combinations netem cannot do; return warnings for ones it does badly."""
    origins = resolver.origins
    if not reorder_has_delay(spec.reorder.probability, spec.delay_us):
        where = origins.get("delay_us")
        raise origins["reorder"].error(
            f"reorder needs a delay on link {resolver.label}"
            + (f" (delay is 0 from {where.key})" if where else " (no delay is set)"),
            value=format_probability(spec.reorder.probability),
            allowed="a delay > 0 on every link with reorder",
        )
    warnings: list[str] = []
    if spec.jitter.amount_us > spec.delay_us:
        where, delay_at = origins["jitter"], origins.get("delay_us")
        delay_from = delay_at.key if delay_at else "no delay set"
        warnings.append(
            f"{where.file}: {where.key}: jitter {format_duration_us(spec.jitter.amount_us)} exceeds "
            f"the delay {format_duration_us(spec.delay_us)} ({delay_from}); "
            "netem clips negative delays to 0, which raises the mean delay"
        )
    return warnings


def check_node_rules(rules: LinkRules, n: int) -> None:
    """No node may be named by two ``nodes`` entries."""
    owner: dict[int, NodeRule] = {}
    for rule in rules.nodes:
        for node in sorted(rule.nodes.nodes(n)):
            if node in owner:
                raise rule.nodes.origin.error(
                    f"node {node} is also in {owner[node].nodes.origin.key} (for {n} workers)",
                    value=rule.nodes.text,
                    allowed="each node in one links.nodes entry at most; common settings go in links.default",
                )
            owner[node] = rule
