"""Churn: scripted events, their durations, and the deterministic expansion of random processes."""

from __future__ import annotations

import textwrap

import pytest

from squall.profiles import ChurnEvent, ChurnKind, Profile, parse_profile

HEAD = "name: t\ndescription: a test profile\n"
K = ChurnKind


def make(body: str) -> Profile:
    return parse_profile(HEAD + textwrap.dedent(body), source="t.yaml")


def kinds(events: list[ChurnEvent]) -> list[tuple[float, str, tuple[int, ...]]]:
    return [(e.at_s, e.kind.value, e.nodes) for e in events]


SCRIPTED = make(
    """
    churn:
      events:
        - {at: 30s, kind: kill, nodes: 3, duration: 10s}
        - {at: 40s, kind: kill, nodes: 3}
        - {at: 50s, kind: pause, nodes: [1, 2], duration: 5s}
        - {at: 70s, kind: link_down, link: "0 <-> 1", duration: 5s}
        - {at: 80s, kind: link_down, link: "2 -> last"}
        - {at: 85s, kind: link_up, link: "2 -> last"}
        - {at: 100s, kind: partition, groups: ["part 1/2", "part 2/2"], duration: 20s}
        - {at: 200s, kind: partition, groups: [0]}
        - {at: 210s, kind: heal}
        - {at: 220s, kind: restart, nodes: last}
        - {at: 1.5s, kind: restart, nodes: 0}
    """
)


def test_scripted_events_expand_in_order() -> None:
    events = SCRIPTED.churn_events(4, 1000.0)
    assert [(e.at_s, e.kind) for e in events] == [
        (1.5, K.RESTART),
        (30.0, K.KILL),
        (40.0, K.RESTART),  # the end of the first kill comes before the second kill at the same time
        (40.0, K.KILL),
        (50.0, K.PAUSE),
        (55.0, K.RESUME),
        (70.0, K.LINK_DOWN),
        (75.0, K.LINK_UP),
        (80.0, K.LINK_DOWN),
        (85.0, K.LINK_UP),
        (100.0, K.PARTITION),
        (120.0, K.HEAL),
        (200.0, K.PARTITION),
        (210.0, K.HEAL),
        (220.0, K.RESTART),
    ]
    by_kind = {(e.at_s, e.kind): e for e in events}
    assert by_kind[(50.0, K.PAUSE)].nodes == (1, 2) == by_kind[(55.0, K.RESUME)].nodes
    assert by_kind[(70.0, K.LINK_DOWN)].links == ((0, 1), (1, 0))
    assert by_kind[(80.0, K.LINK_DOWN)].links == ((2, 3),)
    assert by_kind[(100.0, K.PARTITION)].groups == ((0, 1), (2, 3))
    assert by_kind[(200.0, K.PARTITION)].groups == ((0,), (1, 2, 3))  # the rest form one group
    assert by_kind[(220.0, K.RESTART)].nodes == (3,)
    assert by_kind[(30.0, K.KILL)].origin == "churn.events[0]"


def test_events_at_or_after_the_duration_are_left_out() -> None:
    events = SCRIPTED.churn_events(4, 40.0)
    assert kinds(events) == [(1.5, "restart", (0,)), (30.0, "kill", (3,))]


def test_relative_targets_follow_n() -> None:
    events = SCRIPTED.churn_events(8, 1000.0)
    assert next(e for e in events if e.at_s == 220.0).nodes == (7,)
    assert next(e for e in events if e.at_s == 100.0).groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_events_that_target_nobody_for_this_n_disappear() -> None:
    profile = make("churn: {events: [{at: 1s, kind: kill, nodes: odd, duration: 1s}]}")
    assert profile.churn_events(1, 10.0) == []
    assert kinds(profile.churn_events(4, 10.0)) == [(1.0, "kill", (1, 3)), (2.0, "restart", (1, 3))]


def test_to_dict() -> None:
    event = SCRIPTED.churn_events(4, 1000.0)[6]
    assert event.to_dict() == {
        "at_s": 70.0,
        "kind": "link_down",
        "nodes": [],
        "links": [[0, 1], [1, 0]],
        "groups": [],
        "origin": "churn.events[3]",
    }


RANDOM = """
churn:
  random:
    - kind: kill
      rate: 1/60s
      downtime: 5s..15s
      seed: {seed}
      max_concurrent: {concurrent}
      protect: [0]
"""


def random_profile(seed: int = 7, concurrent: int = 1) -> Profile:
    return make(RANDOM.format(seed=seed, concurrent=concurrent))


def test_same_seed_same_events() -> None:
    first = random_profile(7).churn_events(8, 600.0)
    again = random_profile(7).churn_events(8, 600.0)
    assert first == again
    assert len(first) > 10


def test_different_seed_different_events() -> None:
    assert random_profile(7).churn_events(8, 600.0) != random_profile(8).churn_events(8, 600.0)


def test_random_events_pinned() -> None:
    """The draws must not change between runs, machines or Python versions (str-seeded random.Random)."""
    assert kinds(random_profile(7).churn_events(4, 120.0)) == [
        (54.498053, "kill", (2,)),
        (65.691352, "restart", (2,)),
        (83.235597, "kill", (1,)),
        (91.671711, "restart", (1,)),
        (115.382686, "kill", (3,)),
    ]


def test_a_longer_run_only_adds_events_at_the_end() -> None:
    short = random_profile(7).churn_events(8, 300.0)
    long = random_profile(7).churn_events(8, 900.0)
    assert long[: len(short)] == short
    assert len(long) > len(short)


@pytest.mark.parametrize("seed", [1, 2, 3, 7, 42])
@pytest.mark.parametrize("concurrent", [1, 2])
def test_random_kills_are_well_formed(seed: int, concurrent: int) -> None:
    n = 8
    events = random_profile(seed, concurrent).churn_events(n, 1800.0)
    assert events == sorted(events, key=lambda e: e.at_s)
    down: set[int] = set()
    for event in events:
        (node,) = event.nodes
        assert node != 0, "protected"
        assert 0 < node < n
        if event.kind == K.KILL:
            assert node not in down
            down.add(node)
            assert len(down) <= concurrent
        else:
            assert event.kind == K.RESTART and node in down
            down.remove(node)
    kills = [e for e in events if e.kind == K.KILL]
    restarts = {e.nodes: e.at_s for e in events if e.kind == K.RESTART}
    assert kills and restarts


def test_downtime_is_within_its_window() -> None:
    events = random_profile(3, concurrent=7).churn_events(8, 3600.0)
    started: dict[int, float] = {}
    for event in events:
        if event.kind == K.KILL:
            started[event.nodes[0]] = event.at_s
        else:
            assert 5.0 - 1e-6 <= event.at_s - started.pop(event.nodes[0]) <= 15.0 + 1e-6


def test_rate_is_about_right() -> None:
    """7 targets x 1/600s x 36000s = 420 expected arrivals; Poisson s.d. ~20, so 300..540 is > 5 s.d."""
    profile = make("churn: {random: [{kind: pause, rate: 1/600s, downtime: 1s, seed: 5, protect: 0}]}")
    pauses = [e for e in profile.churn_events(8, 36000.0) if e.kind == K.PAUSE]
    assert 300 <= len(pauses) <= 540


def test_random_skips_nodes_that_scripted_events_hold_down() -> None:
    profile = make(
        """
        churn:
          events: [{at: 0s, kind: kill, nodes: 1}]
          random: [{kind: kill, rate: 1/10s, downtime: 1s, seed: 1, nodes: "1-2"}]
        """
    )
    random_events = [e for e in profile.churn_events(3, 600.0) if e.origin.startswith("churn.random")]
    assert random_events and all(e.nodes == (2,) for e in random_events)


def test_random_link_flaps_take_both_directions_down() -> None:
    profile = make(
        "churn: {random: [{kind: link_down, rate: 1/30s, downtime: 1s..2s, seed: 4, protect: 0, "
        "start: 100s}]}"
    )
    events = profile.churn_events(4, 400.0)
    assert events and all(e.at_s >= 100.0 for e in events)
    for event in events:
        (a, b), (c, d) = event.links
        assert (a, b) == (d, c) and a < b and 0 not in (a, b)
        assert event.kind in (K.LINK_DOWN, K.LINK_UP)


def test_stop_ends_new_failures() -> None:
    profile = make("churn: {random: [{kind: kill, rate: 1/10s, downtime: 1s, seed: 2, stop: 60s}]}")
    kills = [e for e in profile.churn_events(4, 600.0) if e.kind == K.KILL]
    assert kills and all(e.at_s < 60.0 for e in kills)


def test_random_churn_needs_a_finite_duration() -> None:
    with pytest.raises(ValueError, match="finite"):
        random_profile().churn_events(4, float("inf"))
    assert SCRIPTED.churn_events(4, float("inf"))[-1].at_s == 220.0
