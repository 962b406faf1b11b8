"""state_at: links and caps of the phase in force, blocked pairs replayed from churn events."""

from __future__ import annotations

import textwrap

import pytest

from squall.profiles import ChurnEvent, ChurnKind, LinkSpec, NodeLinkSpec, Profile, load_profile, parse_profile
from squall.shaping.planning.state import blocked_after, partition_pairs, state_at

K = ChurnKind


def make(body: str) -> Profile:
    return parse_profile("name: t\ndescription: test\n" + textwrap.dedent(body), source="t.yaml")


PROFILE = make(
    """
    links:
      default: {delay: 5ms}
      nodes:
        - {nodes: 1, uplink: 100mbit}
    phases:
      - at: 60s
        links:
          default: {delay: 50ms}
    churn:
      events:
        - {at: 10s, kind: link_down, link: "0 <-> 1", duration: 5s}
        - {at: 20s, kind: link_down, link: "2 -> 3"}
        - {at: 30s, kind: partition, groups: ["part 1/2", "part 2/2"], duration: 10s}
        - {at: 45s, kind: partition, groups: [0]}
        - {at: 50s, kind: heal}
    """
)
HALVES = partition_pairs([(0, 1), (2, 3)])
ZERO_VS_REST = partition_pairs([(0,), (1, 2, 3)])

AT = [
    pytest.param(0.0, frozenset(), id="start"),
    pytest.param(10.0, frozenset({(0, 1), (1, 0)}), id="down-at-its-time"),
    pytest.param(14.999, frozenset({(0, 1), (1, 0)}), id="still-down"),
    pytest.param(15.0, frozenset(), id="back-up"),
    pytest.param(20.0, frozenset({(2, 3)}), id="one-direction"),
    pytest.param(30.0, HALVES | {(2, 3)}, id="partition-and-link-down-are-independent"),
    pytest.param(40.0, frozenset({(2, 3)}), id="partition-healed-link-still-down"),
    pytest.param(46.0, ZERO_VS_REST | {(2, 3)}, id="second-partition"),
    pytest.param(50.0, frozenset({(2, 3)}), id="heal"),
]


@pytest.mark.parametrize(("at", "blocked"), AT)
def test_blocked_pairs_over_time(at: float, blocked: frozenset[tuple[int, int]]) -> None:
    assert state_at(PROFILE, 4, at).blocked == blocked


def test_links_and_caps_follow_the_phase() -> None:
    early, late = state_at(PROFILE, 4, 59.0), state_at(PROFILE, 4, 60.0)
    assert len(early.links) == 12
    assert set(early.links.values()) == {LinkSpec(delay_us=5000)}
    assert set(late.links.values()) == {LinkSpec(delay_us=50_000)}
    assert early.node_links == {1: NodeLinkSpec(uplink_bps=100_000_000)}


def test_partition_pairs() -> None:
    assert partition_pairs([(0, 1), (2,)]) == {(0, 2), (2, 0), (1, 2), (2, 1)}
    assert len(partition_pairs([range(8), range(8, 16)])) == 2 * 8 * 8


def test_blocked_after_is_a_replay() -> None:
    events = [
        ChurnEvent(1.0, K.LINK_DOWN, links=((0, 1),)),
        ChurnEvent(2.0, K.KILL, nodes=(0,)),
        ChurnEvent(3.0, K.LINK_UP, links=((0, 1),)),
        ChurnEvent(4.0, K.LINK_DOWN, links=((1, 0),)),
    ]
    assert blocked_after(events[:1]) == {(0, 1)}
    assert blocked_after(events[:3]) == frozenset()
    assert blocked_after(events) == {(1, 0)}


def test_random_link_flaps_are_reproducible() -> None:
    profile = load_profile("flaky-links")
    states = [state_at(profile, 8, t).blocked for t in (0.0, 22.0, 95.0, 300.0)]
    assert states == [state_at(profile, 8, t).blocked for t in (0.0, 22.0, 95.0, 300.0)]
    assert (0, 7) in states[1] and (7, 0) in states[1]
    assert partition_pairs([range(4), range(4, 8)]) <= states[2]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="'at'"):
        state_at(PROFILE, 4, -1.0)
    with pytest.raises(ValueError, match="at least one node"):
        state_at(PROFILE, 0, 0.0)
