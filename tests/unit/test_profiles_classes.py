"""Validation checks one link per pair of node classes: the classes are right, and large clusters stay cheap."""

from __future__ import annotations

import itertools

import pytest

from squall.profiles import load_profile
from squall.profiles.loader import parse_profile
from squall.profiles.profile import Profile

SHIPPED = ["heterogeneous", "geo-2-regions", "one-slow-20ms", "flaky-links", "stragglers", "preemptible", "lan"]

BIG = """
name: big
description: a pair naming node 249 (250 workers), odd nodes on thin links, three phases
links:
  default: {delay: 2ms, jitter: 200us, rate: 1gbit}
  nodes:
    - {nodes: odd, egress: {rate: 25mbit, delay: 0ms}}
  pairs:
    - {link: "249 -> 0", delay: 15ms}
phases:
  - {at: 10s, links: {default: {loss: 1%}}}
  - {at: 20s, links: {default: {delay: 5ms}}}
  - {at: 30s}
"""


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("n", [8, 12])
def test_links_of_one_class_pair_resolve_alike(name: str, n: int) -> None:
    profile = load_profile(name)
    if n < profile.required_workers():
        pytest.skip(f"{name} needs {profile.required_workers()} workers")
    classes = profile.node_classes(n)
    assert sorted(itertools.chain(*classes)) == list(range(n))
    for phase in (None, *profile.phases):
        for a, b in itertools.product(classes, classes):
            specs = {profile._resolver(s, d, n, phase).build() for s in a for d in b if s != d}
            assert len(specs) <= 1, (name, n, a, b, specs)


def test_a_250_worker_profile_resolves_a_few_links_not_all_62250(monkeypatch: pytest.MonkeyPatch) -> None:
    profile = parse_profile(BIG.encode(), "big.yaml")
    calls = 0
    real = Profile._resolver

    def counting(self: Profile, *args: object) -> object:
        nonlocal calls
        calls += 1
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Profile, "_resolver", counting)
    warnings = profile.validate_for(250)
    classes = profile.node_classes(250)
    assert len(classes) == 4  # node 0, node 249 (odd), the other odd, the other even
    assert calls <= len(classes) ** 2 * 4  # four link tables (base and three phases)
    # every link out of an odd node (125 x 249) but 249 -> 0, whose pair sets a delay
    assert any(f"on {125 * 249 - 1} links" in w for w in warnings), warnings
