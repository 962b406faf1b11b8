"""Profiles that validate can run (issue 16): every size checked, no self-links, the kernel's bounds,
and random churn whose work is bounded before anything is drawn."""

from __future__ import annotations

import random
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from squall.cli.profiles import VALIDATE_WORKERS, main
from squall.cluster import ClusterSpec, ClusterSpecError
from squall.profiles import LinkSpec, Profile, ProfileError, load_profile, parse_profile
from squall.profiles.bounds import (
    MAX_DELAY_US,
    MAX_JITTER_US,
    MAX_LIMIT_PACKETS,
    MAX_RATE_BPS,
    MAX_WORKERS,
    MIN_RATE_BPS,
)
from squall.profiles.churn import MAX_CHURN_DRAWS, likely_most
from squall.profiles.model import Jitter
from squall.profiles.settings import out_of_bounds
from squall.shaping.planning.checks import UNLIMITED_BPS
from tests.unit.traced_profiles import shipped_params

HEAD = "name: t\ndescription: a test profile\n"
FAST_CHURN = "churn: {random: [{kind: kill, rate: 1/1us, downtime: 1s, seed: 1}]}"


def make(body: str) -> Profile:
    return parse_profile(HEAD + textwrap.dedent(body), source="t.yaml")


def refused(body: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        make(body)
    return info.value


# ----------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("body", "key"),
    [
        pytest.param("links: {pairs: [{link: '0 -> 99', delay: 1ms}]}", "links.pairs[0].link", id="pair"),
        pytest.param("churn: {events: [{at: 1s, kind: kill, nodes: 99, duration: 2s}]}", "churn.events[0].nodes",
                     id="churn-event"),
        pytest.param("churn: {events: [{at: 1s, kind: link_down, link: '99 <-> 0'}]}", "churn.events[0].link",
                     id="churn-link"),
    ],
)
def test_node_99_is_checked_at_100_workers_and_refused_at_99(body: str, key: str) -> None:
    profile = make(body)  # loading checks the smallest size it can be used at
    assert profile.required_workers() == 100
    assert profile.sizes_to_check(VALIDATE_WORKERS) == [100]
    assert profile.validate_for(100) == []
    with pytest.raises(ProfileError) as info:
        profile.validate_for(99)
    assert (info.value.file, info.value.key) == ("t.yaml", key)
    assert info.value.problem == (
        f"node 99 is out of range for 99 workers: the profile needs at least 100 workers (node 99 in {key})"
    )


def test_sizes_start_at_the_smallest_needed_then_the_defaults_above() -> None:
    assert make("links: {pairs: [{link: '0 -> 5', delay: 1ms}]}").sizes_to_check((2, 4, 8, 16)) == [6, 8, 16]
    assert make("regions: {a: part 1/3}").sizes_to_check((2, 4, 8, 16)) == [3, 4, 8, 16]
    assert make("links: {default: {delay: 1ms}}").sizes_to_check((2, 4, 8, 16)) == [2, 4, 8, 16]


def test_part_beyond_the_cluster_is_refused_for_that_size() -> None:
    profile = make("regions: {a: part 3/4}")
    with pytest.raises(ProfileError) as info:
        profile.validate_for(3)
    assert info.value.key == "regions.a"
    assert "part 3/4 is out of range for 3 workers: the profile needs at least 4 workers" in info.value.problem


def test_validate_cli_checks_node_40_and_says_what_needs_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "c40.yaml"
    path.write_text(HEAD + "churn: {events: [{at: 1s, kind: kill, nodes: 40, duration: 2s}]}\n")
    code = main(["profiles", "validate", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.strip() == (
        f"ok      {path} (t; checked for 41 workers; needs at least 41 (node 40 in churn.events[0].nodes))"
    )


@pytest.mark.parametrize(
    ("body", "key", "what"),
    [
        pytest.param("links: {pairs: [{link: '0 -> 250', delay: 1ms}]}", "links.pairs[0].link", "node 250",
                     id="pair"),
        pytest.param("churn: {events: [{at: 1s, kind: pause, nodes: '3-400'}]}", "churn.events[0].nodes",
                     "node 400", id="range"),
        pytest.param("regions: {a: part 1/251}", "regions.a", "part 1/251", id="part"),
        pytest.param("devices: {nodes: [{nodes: -251, slowdown: 2}]}", "devices.nodes[0].nodes", "node -251",
                     id="negative"),
    ],
)
def test_a_node_beyond_the_largest_cluster_is_refused_when_read(body: str, key: str, what: str) -> None:
    error = refused(body)
    assert error.key == key
    assert error.problem.startswith(f"{what} needs at least ")
    assert error.problem.endswith(f"more than the {MAX_WORKERS} a cluster can have")


def test_the_largest_cluster_is_the_cluster_specs() -> None:
    ClusterSpec(workers=MAX_WORKERS, cpus=1.0, image="squall-worker")
    with pytest.raises(ClusterSpecError, match="workers must be"):
        ClusterSpec(workers=MAX_WORKERS + 1, cpus=1.0, image="squall-worker")
    assert make("links: {pairs: [{link: '0 -> 249', delay: 1ms}]}").required_workers() == MAX_WORKERS


# ----------------------------------------------------------------------------- self-links


@pytest.mark.parametrize(
    ("body", "key"),
    [
        pytest.param("links: {pairs: [{link: '3 -> 3', delay: 1ms}]}", "links.pairs[0].link", id="directed"),
        pytest.param("links: {pairs: [{link: '3 <-> 3', delay: 1ms}]}", "links.pairs[0].link", id="symmetric"),
        pytest.param("links: {pairs: [{link: 'last -> -1', delay: 1ms}]}", "links.pairs[0].link",
                     id="same-node-two-spellings"),
        pytest.param("phases: [{at: 1s, links: {pairs: [{link: 'first <-> 0', loss: 1%}]}}]",
                     "phases[0].links.pairs[0].link", id="phase"),
        pytest.param("churn: {events: [{at: 1s, kind: link_down, link: '2 <-> 2', duration: 1s}]}",
                     "churn.events[0].link", id="link-down"),
        pytest.param("churn: {events: [{at: 1s, kind: link_up, link: '5 -> 5'}]}", "churn.events[0].link",
                     id="link-up"),
    ],
)
def test_a_node_linked_to_itself_is_an_error(body: str, key: str) -> None:
    error = refused(body)
    assert (error.file, error.key) == ("t.yaml", key)
    assert error.problem.startswith("links a node to itself")
    assert "two different nodes" in error.allowed


@pytest.mark.parametrize("link", ["all -> all", "0-3 <-> 2-5", "odd -> last", "part 1/2 -> 0"])
def test_selectors_that_also_name_real_links_skip_the_self_pairs(link: str) -> None:
    profile = make(f"links: {{pairs: [{{link: '{link}', delay: 7ms}}]}}")
    for n in (profile.required_workers(), 8):
        assert all(src != dst for src, dst in profile.links(n))
    assert any(spec.delay_us == 7000 for spec in profile.links(8).values())


# ----------------------------------------------------------------------------- numeric bounds


@pytest.mark.parametrize(
    ("body", "key", "problem", "written"),
    [
        pytest.param("links: {default: {rate: 1e32bit}}", "links.default.rate", "a rate must be at most 100gbit",
                     "'1e32bit'", id="rate-1e32"),
        pytest.param("links: {default: {rate: 101gbit}}", "links.default.rate", "a rate must be at most 100gbit",
                     "'101gbit'", id="rate-above-the-htb-root"),
        pytest.param("links: {default: {rate: 7bit}}", "links.default.rate", "a rate must be at least 8bit",
                     "'7bit'", id="rate-below-a-byte"),
        pytest.param("links: {nodes: [{nodes: 0, uplink: 1e32bit}]}", "links.nodes[0].uplink",
                     "a rate must be at most 100gbit", "'1e32bit'", id="uplink"),
        pytest.param("links: {default: {limit: 100000000000000000000000000}}", "links.default.limit",
                     "a queue limit must be at most 4294967295 packets", "100000000000000000000000000",
                     id="limit-1e26"),
        pytest.param("links: {default: {limit: 4294967296p}}", "links.default.limit",
                     "a queue limit must be at most 4294967295 packets", "'4294967296p'", id="limit-2^32"),
        pytest.param("links: {default: {delay: 1000000000000000s}}", "links.default.delay",
                     f"a delay must be at most {MAX_DELAY_US}us", "'1000000000000000s'", id="delay-1e15s"),
        pytest.param("links: {default: {delay: 5ms, jitter: 3s}}", "links.default.jitter",
                     "a jitter must be at most 2147483us", "'3s'", id="jitter"),
        pytest.param("links: {pairs: [{link: '0 -> 1', delay: 5s, jitter: {amount: 2148ms}}]}",
                     "links.pairs[0].jitter.amount", "a jitter must be at most 2147483us", "'2148ms'",
                     id="jitter-amount"),
        pytest.param("links: {default: {loss: 100.5%}}", "links.default.loss",
                     "a percentage must be between 0% and 100%", "'100.5%'", id="loss-above-100"),
        pytest.param("links: {default: {duplicate: 250%}}", "links.default.duplicate",
                     "a percentage must be between 0% and 100%", "'250%'", id="duplicate-above-100"),
        pytest.param("links: {default: {loss: {percent: 1%, correlation: 100%}}}", "links.default.loss.correlation",
                     "a correlation must be below 100%", "'100%'", id="correlation-100"),
        pytest.param("links: {default: {delay: 1ms, jitter: {amount: 1ms, correlation: 100%}}}",
                     "links.default.jitter.correlation", "a correlation must be below 100%", "'100%'",
                     id="jitter-correlation-100"),
        pytest.param("links: {default: {loss: {gemodel: {p: 0%, r: 0%}}}}", "links.default.loss.gemodel.r",
                     "p = r = 0% never moves between the states", "{'p': '0%', 'r': '0%'}", id="gemodel-still"),
    ],
)
def test_numbers_beyond_what_the_kernel_and_backends_accept_are_refused_when_read(
    body: str, key: str, problem: str, written: str
) -> None:
    error = refused(body)
    assert (error.file, error.key) == ("t.yaml", key), str(error)
    assert error.problem == problem or error.problem.startswith(problem), str(error)
    assert f"(got {written})" in str(error)  # the value as written, not as converted


def test_each_range_names_its_source_in_the_message() -> None:
    assert "netem caps jitter at 2^31-1 ns" in refused("links: {default: {delay: 5ms, jitter: 3s}}").allowed
    assert "netem's 64-bit latency" in refused("links: {default: {delay: 1000000000000000s}}").allowed
    assert "HTB class sits under a 100gbit root" in refused("links: {default: {rate: 1e32bit}}").allowed
    assert "32-bit" in refused("links: {default: {limit: 100000000000000000000000000}}").allowed


def test_the_bounds_themselves_are_accepted() -> None:
    # durations are read as floats: above 2^53 us only even counts are exact, and MAX_DELAY_US is odd
    profile = make(f"""
        links:
          default: {{delay: {MAX_DELAY_US - 1}us, jitter: {MAX_JITTER_US}us, rate: 100gbit, limit: {MAX_LIMIT_PACKETS}}}
          pairs: [{{link: '0 -> 1', rate: 8bit, loss: {{percent: 100%, correlation: 99.9%}}}}]
        """)
    spec = profile.link(0, 1, 2)
    assert (spec.delay_us, spec.jitter.amount_us, spec.rate_bps, spec.limit_packets) == (
        MAX_DELAY_US - 1, MAX_JITTER_US, MIN_RATE_BPS, MAX_LIMIT_PACKETS,
    )
    assert out_of_bounds(spec) is None and out_of_bounds(profile.link(1, 0, 2)) is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param(LinkSpec(delay_us=MAX_DELAY_US + 1), "delay_us must be an integer", id="delay"),
        pytest.param(LinkSpec(delay_us=10, jitter=Jitter(MAX_JITTER_US + 1)), "jitter must be an integer",
                     id="jitter"),
        pytest.param(LinkSpec(rate_bps=MAX_RATE_BPS + 1), "bad rate_bps", id="rate"),
        pytest.param(LinkSpec(rate_bps=MIN_RATE_BPS - 1), "bad rate_bps", id="slow-rate"),
        pytest.param(LinkSpec(limit_packets=MAX_LIMIT_PACKETS + 1), "bad limit_packets", id="limit"),
    ],
)
def test_hand_built_values_share_the_bounds(spec: LinkSpec, fragment: str) -> None:
    problem = out_of_bounds(spec)
    assert problem is not None and fragment in problem


def test_the_unlimited_rate_of_the_shaping_tree_is_the_highest_rate() -> None:
    assert UNLIMITED_BPS == MAX_RATE_BPS


# ----------------------------------------------------------------------------- random churn


def _recording(draws: list[float]) -> Callable[[random.Random, float], float]:
    """A stand-in for ``Random.expovariate`` that records each rate asked for and returns 1 s."""
    def expovariate(self: random.Random, rate: float) -> float:
        draws.append(rate)
        return 1.0
    return expovariate


def test_absurd_churn_is_refused_when_read_with_the_count_key_and_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[float] = []  # refused from the computed count: not one arrival is drawn
    monkeypatch.setattr(random.Random, "expovariate", _recording(draws))
    error = refused(FAST_CHURN)
    assert draws == []
    assert (error.file, error.key) == ("t.yaml", "churn.random[0].rate")
    assert error.problem.startswith("random churn draws about 1.2e+09 failures in a 600s run of 2 workers")
    assert f"more than the {MAX_CHURN_DRAWS} a run may have" in error.problem
    assert "this entry: 2 nodes x 1e+06/s x 600s" in error.problem
    assert "(got '1/1us')" in str(error)


def test_the_run_length_decides_and_is_refused_before_drawing() -> None:
    profile = make("churn: {random: [{kind: kill, rate: 1/100ms, downtime: 1ms, seed: 3}]}")  # 12000 at 2 x 600 s
    assert len(profile.churn_events(2, 1.0)) > 0
    draws: list[float] = []
    with pytest.MonkeyPatch.context() as patch, pytest.raises(ProfileError) as info:
        patch.setattr(random.Random, "expovariate", _recording(draws))
        profile.churn_events(8, 3600.0)
    assert draws == []  # refused before drawing
    assert "in a 3600s run of 8 workers" in info.value.problem


def test_link_down_counts_node_pairs() -> None:
    body = "churn: {random: [{kind: link_down, rate: 1/1s, downtime: 1ms, seed: 3, stop: 100s}]}"
    profile = make(body)
    assert profile.churn.random[0].expected_draws(16, 600.0) == 120 * 100
    profile.validate_for(40)  # 780 pairs x 100 s: 78000 draws, up to 79682
    with pytest.raises(ProfileError) as info:
        profile.validate_for(50)  # 1225 pairs x 100 s
    assert "this entry: 1225 node pairs x 1/s x 100s = about 122500" in info.value.problem


def test_show_refuses_absurd_churn_without_running_out_of_memory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "late.yaml"  # one failure per microsecond per node, from 700 s on
    path.write_text(HEAD + "churn: {random: [{kind: kill, rate: 1/1us, downtime: 1s, seed: 1, start: 700s}]}\n")
    assert load_profile(path).validate_for(8) == []  # nothing starts in a run of 600 s
    draws: list[float] = []
    monkeypatch.setattr(random.Random, "expovariate", _recording(draws))
    code = main(["profiles", "show", str(path), "--duration", "1h"])
    _, err = capsys.readouterr()
    assert draws == []  # refused from the computed count, before a single arrival is drawn
    assert code == 2
    assert err.startswith(f"error: {path}: churn.random[0].rate: random churn draws about 1.16e+10 failures in a 3600s")


def test_the_upper_count_is_above_the_mean() -> None:
    assert likely_most(0.0) == 6.0
    assert 10_000 + 600 < likely_most(10_000.0) < 10_000 + 700


# ----------------------------------------------------------------------------- shipped profiles


@pytest.mark.parametrize("path", shipped_params())
def test_every_shipped_profile_still_validates(path: Path) -> None:
    profile = load_profile(path)
    for n in profile.sizes_to_check(VALIDATE_WORKERS):
        profile.validate_for(n)
