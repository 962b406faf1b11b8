"""Regions: named groups of nodes (``regions: {eu: "part 1/2", us: "part 2/2"}``).

A node belongs to at most one region; nodes in no region only get the ``default`` and more specific
link scopes.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

from squall.profiles.errors import Origin
from squall.profiles.selectors import NodeSelector, parse_selector

_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
NAME_ALLOWED: Final = "a name of letters, digits, _ and -, starting with a letter or _"


@dataclass(frozen=True)
class Region:
    """A named group of nodes."""

    name: str  # as used in links.inside and links.between
    nodes: NodeSelector  # its members


@dataclass(frozen=True)
class RegionSet:
    """All regions of a profile."""

    origin: Origin  # the "regions" key
    regions: tuple[Region, ...] = ()  # in the order written

    @property
    def names(self) -> tuple[str, ...]:
        """The region names."""
        return tuple(region.name for region in self.regions)

    def require(self, origin: Origin, name: str) -> None:
        """Raise a ProfileError at ``origin`` unless ``name`` is a defined region."""
        if name not in self.names:
            allowed = (
                ", ".join(self.names) if self.names else "none: define them under the top-level regions key"
            )
            raise origin.error(f"unknown region {name!r}", value=name, allowed=allowed)

    def region_of(self, n: int) -> dict[int, str]:
        """Node -> region name for n workers; a node in two regions raises ProfileError."""
        return _region_map(self, n)


@functools.lru_cache(maxsize=256)
def _region_map(regions: RegionSet, n: int) -> dict[int, str]:
    """Cached node -> region map (callers must not modify it)."""
    owner: dict[int, str] = {}
    for region in regions.regions:
        for node in sorted(region.nodes.nodes(n)):
            if node in owner:
                raise region.nodes.origin.error(
                    f"node {node} is already in region {owner[node]} (for {n} workers)",
                    value=region.nodes.text,
                    allowed="disjoint regions",
                )
            owner[node] = region.name
    return owner


def parse_regions(origin: Origin, raw: object) -> RegionSet:
    """Read ``regions: {NAME: SELECTOR, ...}``."""
    if not isinstance(raw, dict):
        raise origin.error("must be a mapping", value=raw, allowed="NAME: NODE-SELECTOR entries")
    names: list[str] = []
    for name in raw:
        if not isinstance(name, str) or not _NAME.match(name):
            raise origin.error("not a region name", value=name, allowed=NAME_ALLOWED)
        names.append(name)
    regions = tuple(Region(name, parse_selector(origin.at(name), raw[name])) for name in names)
    return RegionSet(origin, regions)
