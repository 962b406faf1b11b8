"""Every kind of bad profile is rejected with the file, the key path, the value and what is allowed."""

from __future__ import annotations

import pickle
import textwrap

import pytest

from squall.profiles import Profile, ProfileError, parse_profile

HEAD = "name: t\ndescription: a test profile\n"


def make(body: str, head: str = HEAD) -> Profile:
    """Parse a profile from a YAML body (name and description added)."""
    return parse_profile(head + textwrap.dedent(body), source="t.yaml")


# (YAML body, key path, fragment of the problem, fragment of "allowed")
REJECTED = [
    pytest.param("colour: red\n", "colour", "unknown key", "description", id="unknown-top-key"),
    pytest.param(
        "links: {default: {latency: 5ms}}",
        "links.default.latency",
        "unknown key",
        "delay",
        id="unknown-link-key",
    ),
    pytest.param(
        "links: {pairs: [{link: '0 -> 1', dealy: 5ms}]}",
        "links.pairs[0].dealy",
        "unknown key",
        "delay",
        id="unknown-pair-key",
    ),
    pytest.param(
        "links: {default: {jitter: {amount: 1ms, spread: 2}}}",
        "links.default.jitter.spread",
        "unknown key",
        "distribution",
        id="unknown-jitter-key",
    ),
    pytest.param("links: {colour: {}}", "links.colour", "unknown key", "pairs", id="unknown-links-key"),
    pytest.param("links:\n", "links", "must be a mapping", "default", id="empty-links"),
    pytest.param(
        "links: {pairs: {link: '0 -> 1'}}", "links.pairs", "must be a list", "YAML list", id="pairs-not-list"
    ),
    pytest.param(
        "links: {default: {delay: 20}}", "links.default.delay", "needs a unit", "ms", id="bare-delay"
    ),
    pytest.param(
        "links: {default: {delay: 20 parsecs}}",
        "links.default.delay",
        "unknown duration unit",
        "ms",
        id="bad-delay-unit",
    ),
    pytest.param(
        "links: {default: {delay: -5ms}}", "links.default.delay", "negative", "ms", id="negative-delay"
    ),
    pytest.param(
        "links: {default: {delay: 5ms, jitter: -1ms}}",
        "links.default.jitter",
        "negative",
        "ms",
        id="negative-jitter",
    ),
    pytest.param(
        "links: {default: {rate: -1mbit}}", "links.default.rate", "at least 1bit", "mbit", id="negative-rate"
    ),
    pytest.param("links: {default: {rate: 0}}", "links.default.rate", "link_down", "mbit", id="zero-rate"),
    pytest.param(
        "links: {default: {rate: 10Mbps}}", "links.default.rate", "ambiguous", "mbit", id="ambiguous-rate"
    ),
    pytest.param(
        "links: {pairs: [{link: '0 -> 1', loss: 120%}]}",
        "links.pairs[0].loss",
        "between 0% and 100%",
        "0% to 100%",
        id="loss-over-100",
    ),
    pytest.param(
        "links: {default: {loss: -1%}}",
        "links.default.loss",
        "between 0% and 100%",
        "0% to 100%",
        id="loss-negative",
    ),
    pytest.param(
        "links: {default: {loss: 0.01}}", "links.default.loss", "% sign", "0% to 100%", id="loss-no-sign"
    ),
    pytest.param(
        "links: {default: {loss: {correlation: 25%}}}",
        "links.default.loss.correlation",
        "loss correlation without loss",
        "percent > 0%",
        id="loss-correlation-alone",
    ),
    pytest.param(
        "links: {default: {loss: {percent: 0%, correlation: 25%}}}",
        "links.default.loss.correlation",
        "loss correlation without loss",
        "percent > 0%",
        id="loss-correlation-zero-loss",
    ),
    pytest.param(
        "links: {default: {duplicate: {correlation: 5%}}}",
        "links.default.duplicate.correlation",
        "duplicate correlation without duplicate",
        "percent > 0%",
        id="duplicate-correlation-alone",
    ),
    pytest.param(
        "links: {default: {delay: 5ms, reorder: {correlation: 5%}}}",
        "links.default.reorder.correlation",
        "reorder correlation without reorder",
        "percent > 0%",
        id="reorder-correlation-alone",
    ),
    pytest.param(
        "links: {default: {jitter: {amount: 0ms, correlation: 5%}}}",
        "links.default.jitter.amount",
        "without jitter",
        "amount > 0",
        id="jitter-correlation-alone",
    ),
    pytest.param(
        "links: {default: {jitter: {correlation: 5%}}}",
        "links.default.jitter.amount",
        "is required",
        "duration",
        id="jitter-without-amount",
    ),
    pytest.param(
        "links: {default: {jitter: {amount: 1ms, distribution: gaussian}}}",
        "links.default.jitter.distribution",
        "unknown distribution",
        "uniform, normal, pareto, paretonormal",
        id="unknown-distribution",
    ),
    pytest.param(
        "links: {default: {loss: {percent: 1%, gemodel: {p: 1%, r: 10%}}}}",
        "links.default.loss",
        "gemodel and random loss",
        "either",
        id="gemodel-and-random",
    ),
    pytest.param(
        "links: {default: {loss: {gemodel: {r: 10%}}}}",
        "links.default.loss.gemodel.p",
        "is required",
        "percentage",
        id="gemodel-without-p",
    ),
    pytest.param(
        "links: {default: {loss: {gemodel: {p: 1%, r: 0%}}}}",
        "links.default.loss.gemodel.r",
        "never leaves",
        "r > 0%",
        id="gemodel-stuck",
    ),
    pytest.param(
        "links: {default: {loss: {gemodel: {p: 1%, r: 5%, h: 1%}}}}",
        "links.default.loss.gemodel.h",
        "unknown key",
        "1-h",
        id="gemodel-unknown-key",
    ),
    pytest.param(
        "links: {default: {limit: 0}}", "links.default.limit", "at least 1", "packets", id="zero-limit"
    ),
    pytest.param(
        "links: {default: {reorder: 10%}}",
        "links.default.reorder",
        "reorder needs a delay",
        "delay > 0",
        id="reorder-without-delay",
    ),
    pytest.param(
        "links: {default: {delay: 5ms, reorder: 10%}, pairs: [{link: '0 -> 1', delay: 0}]}",
        "links.default.reorder",
        "delay is 0 from links.pairs[0].delay",
        "delay > 0",
        id="reorder-delay-removed-by-pair",
    ),
    pytest.param(
        "links: {pairs: [{link: '0 -> 1', delay: 1ms}, {link: '0 -> 1', delay: 2ms}]}",
        "links.pairs[1].link",
        "the same pair as links.pairs[0]",
        "each pair once",
        id="duplicated-pair",
    ),
    pytest.param(
        "links: {pairs: [{link: '0 <-> 1', delay: 1ms}, {link: '1 <-> 0', delay: 2ms}]}",
        "links.pairs[1].link",
        "the same pair",
        "each pair once",
        id="duplicated-symmetric-pair",
    ),
    pytest.param(
        "links: {pairs: [{link: '0-1 -> 2', delay: 1ms}, {link: '0 -> 2-3', delay: 2ms}]}",
        "links.pairs[1].link",
        "covers link 0->2 like links.pairs[0]",
        "at most one",
        id="overlapping-pairs",
    ),
    pytest.param(
        "links: {pairs: [{link: '0 to 1', delay: 1ms}]}",
        "links.pairs[0].link",
        "not a link expression",
        "A -> B",
        id="bad-link-expression",
    ),
    pytest.param(
        "links: {pairs: [{delay: 1ms}]}",
        "links.pairs[0].link",
        "is required",
        "A -> B",
        id="pair-without-link",
    ),
    pytest.param(
        "links: {pairs: [{link: '0..3 -> 4', delay: 1ms}]}",
        "links.pairs[0].link",
        "not a node selector",
        "part I/K",
        id="bad-selector",
    ),
    pytest.param(
        "links: {pairs: [{link: '3-1 -> 4', delay: 1ms}]}",
        "links.pairs[0].link",
        "start is above",
        "range",
        id="backwards-range",
    ),
    pytest.param(
        "links: {pairs: [{link: 'part 3/2 -> 4', delay: 1ms}]}",
        "links.pairs[0].link",
        "1 <= I <= K",
        "part I/K",
        id="bad-part",
    ),
    pytest.param(
        "regions: {eu: 0}\nlinks: {between: [{link: 'eu <-> us', delay: 40ms}]}",
        "links.between[0].link",
        "unknown region 'us'",
        "eu",
        id="unknown-region",
    ),
    pytest.param(
        "regions: {eu: 0, us: 1}\nlinks: {between: [{link: 'eu -> eu', delay: 40ms}]}",
        "links.between[0].link",
        "a region to itself",
        "links.inside.eu",
        id="region-to-itself",
    ),
    pytest.param(
        "regions: {eu: 0, us: 1}\nlinks: {inside: {asia: {delay: 1ms}}}",
        "links.inside.asia",
        "unknown key",
        "eu, us",
        id="inside-unknown-region",
    ),
    pytest.param(
        "regions: {eu: '0-1', us: '1-2'}",
        "regions.us",
        "already in region eu",
        "disjoint",
        id="node-in-two-regions",
    ),
    pytest.param("regions: {'e u': 0}", "regions", "not a region name", "letters", id="bad-region-name"),
    pytest.param(
        "regions: {eu: 0, us: 1}\nlinks: {between: [{link: 'eu <-> us', delay: 1ms}, "
        "{link: 'us <-> eu', delay: 2ms}]}",
        "links.between[1].link",
        "the same region link",
        "each region link once",
        id="duplicated-region-link",
    ),
    pytest.param(
        "links: {nodes: [{nodes: '0-1', egress: {rate: 1mbit}}, {nodes: 1, ingress: {rate: 2mbit}}]}",
        "links.nodes[1].nodes",
        "node 1 is also in links.nodes[0].nodes",
        "one links.nodes entry",
        id="node-in-two-entries",
    ),
    pytest.param(
        "links: {nodes: [{nodes: 0, egress: {delay: 1ms}}, {nodes: 1, ingress: {delay: 2ms}}]}",
        "links.nodes[1].ingress.delay",
        "conflicts with links.nodes[0].egress.delay on link 0->1",
        "links.pairs",
        id="egress-ingress-conflict",
    ),
    pytest.param(
        "links: {nodes: [{nodes: 0}]}", "links.nodes[0]", "sets nothing", "egress", id="empty-node-entry"
    ),
    pytest.param(
        "links: {nodes: [{egress: {delay: 1ms}}]}",
        "links.nodes[0].nodes",
        "is required",
        "selector",
        id="node-entry-without-nodes",
    ),
    pytest.param(
        "phases: [{at: 30s}, {at: 10s}]",
        "phases[1].at",
        "increasing time order",
        "after phases[0].at",
        id="phases-unsorted",
    ),
    pytest.param(
        "phases: [{at: 30s}, {at: 30s}]",
        "phases[1].at",
        "increasing time order",
        "after",
        id="phases-same-time",
    ),
    pytest.param("phases: [{at: -5s}]", "phases[0].at", "negative", "ms", id="phase-negative-time"),
    pytest.param(
        "phases: [{at: 5s, link: {}}]", "phases[0].link", "unknown key", "links", id="phase-unknown-key"
    ),
    pytest.param("phases: [{links: {}}]", "phases[0].at", "is required", "time", id="phase-without-time"),
    pytest.param(
        "phases: [{at: 5s, links: {default: {loss: 200%}}}]",
        "phases[0].links.default.loss",
        "between 0% and 100%",
        "0% to 100%",
        id="phase-bad-value",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: explode, nodes: 1}]}",
        "churn.events[0].kind",
        "unknown or missing kind",
        "kill, pause",
        id="unknown-churn-kind",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: kill, link: '0 -> 1'}]}",
        "churn.events[0].link",
        "unknown key",
        "nodes, duration",
        id="churn-key-for-other-kind",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: kill}]}",
        "churn.events[0].nodes",
        "is required for kill",
        "",
        id="kill-without-nodes",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: restart, nodes: 1, duration: 3s}]}",
        "churn.events[0].duration",
        "unknown key",
        "nodes",
        id="restart-with-duration",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: kill, nodes: 1, duration: 0s}]}",
        "churn.events[0].duration",
        "longer than 0",
        "ms",
        id="zero-duration",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: kill, nodes: 1}, {at: 9s, kind: kill, nodes: 1}]}",
        "churn.events[1]",
        "cannot kill node 1 at 9s: it is killed",
        "restart any",
        id="kill-killed-node",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: resume, nodes: 1}]}",
        "churn.events[0]",
        "cannot resume node 1 at 5s: it is up",
        "resume a paused one",
        id="resume-running-node",
    ),
    pytest.param(
        "churn: {events: [{at: 5s, kind: partition, groups: ['0-1', '1-2']}]}",
        "churn.events[0].groups[1]",
        "node 1 is also in churn.events[0].groups[0]",
        "disjoint",
        id="overlapping-partition",
    ),
    pytest.param(
        "churn: {random: [{kind: kill, rate: 1/60s, downtime: 5s}]}",
        "churn.random[0].seed",
        "is required",
        "whole number",
        id="random-without-seed",
    ),
    pytest.param(
        "churn: {random: [{kind: partition, rate: 1/60s, downtime: 5s, seed: 1}]}",
        "churn.random[0].kind",
        "unknown or missing kind",
        "kill, pause, link_down",
        id="random-bad-kind",
    ),
    pytest.param(
        "churn: {random: [{kind: kill, rate: 60s, downtime: 5s, seed: 1}]}",
        "churn.random[0].rate",
        "event rate",
        "COUNT/DURATION",
        id="random-bad-rate",
    ),
    pytest.param(
        "churn: {random: [{kind: kill, rate: 1/60s, downtime: 15s..5s, seed: 1}]}",
        "churn.random[0].downtime",
        "low end is above",
        "LOW..HIGH",
        id="random-bad-downtime",
    ),
    pytest.param(
        "churn: {random: [{kind: kill, rate: 1/60s, downtime: 5s, seed: 1, max_concurrent: 0}]}",
        "churn.random[0].max_concurrent",
        "at least 1",
        "whole number",
        id="random-zero-concurrency",
    ),
    pytest.param(
        "churn: {random: [{kind: kill, rate: 1/60s, downtime: 5s, seed: 1, start: 9s, stop: 5s}]}",
        "churn.random[0].stop",
        "not after start",
        "stop > start",
        id="random-stop-before-start",
    ),
    pytest.param(
        "devices: {default: {straggler: {probability: 5%, factor: 0.5}}}",
        "devices.default.straggler.factor",
        "slower, not faster",
        ">= 1",
        id="straggler-faster",
    ),
    pytest.param(
        "devices: {default: {straggler: {probability: 5%}}}",
        "devices.default.straggler.factor",
        "is required",
        "factor",
        id="straggler-without-factor",
    ),
    pytest.param(
        "devices: {default: {noise: -0.1}}",
        "devices.default.noise",
        "log-normal sigma",
        "0 to 3",
        id="negative-noise",
    ),
    pytest.param(
        "devices: {default: {slowdown: 0}}", "devices.default.slowdown", "> 0", "positive", id="zero-slowdown"
    ),
    pytest.param(
        "devices: {nodes: [{nodes: 0, speed: 2}]}",
        "devices.nodes[0].speed",
        "unknown key",
        "slowdown",
        id="unknown-device-key",
    ),
    pytest.param(
        "devices: {nodes: [{nodes: '0-1', slowdown: 2}, {nodes: 1, slowdown: 3}]}",
        "devices.nodes[1].nodes",
        "node 1 is also in devices.nodes[0].nodes",
        "one devices.nodes entry",
        id="device-node-twice",
    ),
    pytest.param("min_workers: 0", "min_workers", "at least 1", "whole number", id="zero-min-workers"),
]


@pytest.mark.parametrize(("body", "key", "problem", "allowed"), REJECTED)
def test_rejected(body: str, key: str, problem: str, allowed: str) -> None:
    with pytest.raises(ProfileError) as info:
        make(body)
    error = info.value
    assert (error.file, error.key) == ("t.yaml", key), str(error)
    assert str(error).startswith(f"t.yaml: {key}: "), str(error)
    assert problem in error.problem, str(error)
    assert allowed in error.allowed, str(error)
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        pytest.param("", "(top level)", "the file is empty", id="empty-file"),
        pytest.param("# only a comment\n", "(top level)", "the file is empty", id="comment-only"),
        pytest.param("- a\n- b\n", "(top level)", "must be a mapping", id="list-document"),
        pytest.param("just text\n", "(top level)", "must be a mapping", id="scalar-document"),
        pytest.param("name: [\n", "(yaml)", "not valid YAML", id="broken-yaml"),
        pytest.param(
            "name: a\nname: b\ndescription: d\n",
            "name",
            "the key 'name' is written twice in one mapping (lines 1 and 2)",
            id="duplicated-yaml-key",
        ),
        pytest.param("description: d\n", "name", "is required", id="missing-name"),
        pytest.param("name: t\n", "description", "is required", id="missing-description"),
        pytest.param("name: Wan 5\ndescription: d\n", "name", "characters that are not allowed", id="bad-name"),
        pytest.param("name: t\ndescription: ''\n", "description", "must not be empty", id="empty-description"),
    ],
)
def test_rejected_documents(text: str, key: str, problem: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile(text, source="t.yaml")
    assert (info.value.file, info.value.key) == ("t.yaml", key), str(info.value)
    assert problem in str(info.value)


def test_message_shows_the_offending_value() -> None:
    with pytest.raises(ProfileError) as info:
        make("links: {pairs: [{link: '0 -> 1', loss: 120%}]}")
    assert str(info.value) == (
        "t.yaml: links.pairs[0].loss: a percentage must be between 0% and 100% (got '120%'); "
        "allowed: a percentage from 0% to 100% (e.g. 1%, 0.5%), or 0"
    )


@pytest.mark.parametrize(
    ("body", "n", "key", "problem"),
    [
        pytest.param(
            "links: {pairs: [{link: '0 -> 7', delay: 1ms}]}",
            4,
            "links.pairs[0].link",
            "node 7 is out of range for 4 workers",
            id="pair-out-of-range",
        ),
        pytest.param(
            "churn: {events: [{at: 1s, kind: kill, nodes: 5}]}",
            4,
            "churn.events[0].nodes",
            "node 5 is out of range for 4 workers",
            id="churn-target-out-of-range",
        ),
        pytest.param(
            "churn: {events: [{at: 1s, kind: link_down, link: '0 <-> 9'}]}",
            4,
            "churn.events[0].link",
            "node 9 is out of range",
            id="churn-link-out-of-range",
        ),
        pytest.param(
            "churn: {random: [{kind: kill, rate: 1/60s, downtime: 5s, seed: 1, protect: 6}]}",
            3,
            "churn.random[0].protect",
            "node 6 is out of range",
            id="protect-out-of-range",
        ),
        pytest.param(
            "devices: {nodes: [{nodes: '2-9', slowdown: 2}]}",
            8,
            "devices.nodes[0].nodes",
            "node 9 is out of range for 8 workers",
            id="device-range-out-of-range",
        ),
        pytest.param("regions: {eu: -5}", 4, "regions.eu", "node -5 is out of range", id="negative-index"),
        pytest.param("min_workers: 4", 2, "min_workers", "at least 4 workers", id="below-min-workers"),
        pytest.param(
            "links: {nodes: [{nodes: odd, egress: {rate: 1mbit}}, {nodes: part 1/2, uplink: 2mbit}]}",
            4,
            "links.nodes[1].nodes",
            "node 1 is also in links.nodes[0].nodes",
            id="overlap-only-for-some-n",
        ),
    ],
)
def test_rejected_for_n(body: str, n: int, key: str, problem: str) -> None:
    profile = make(body)  # loads: the profile is fine for some cluster size
    with pytest.raises(ProfileError) as info:
        profile.validate_for(n)
    assert (info.value.file, info.value.key) == ("t.yaml", key), str(info.value)
    assert problem in info.value.problem, str(info.value)


def test_jitter_above_delay_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    profile = make("links: {default: {delay: 1ms, jitter: 5ms}}")
    warnings = profile.validate_for(4)
    assert len(warnings) == 1
    assert "links.default.jitter: jitter 5ms exceeds the delay 1ms (links.default.delay)" in warnings[0]
    assert "on 12 links" in warnings[0]
    assert any("exceeds the delay" in record.message for record in caplog.records)


def test_a_bad_phase_rejects_the_whole_profile() -> None:
    """Nothing is half-applied: one bad key anywhere means no profile at all."""
    with pytest.raises(ProfileError):
        make("links: {default: {delay: 5ms}}\nphases: [{at: 10s, links: {default: {reorder: 5%, delay: 0}}}]")


def test_link_resolution_checks_combinations_too() -> None:
    profile = make("links: {default: {delay: 5ms, reorder: 5%}}\nmin_workers: 1")
    with pytest.raises(ValueError, match="two different nodes"):
        profile.link(1, 1, 4)
    with pytest.raises(ValueError, match="not in a cluster of 4"):
        profile.link(0, 4, 4)


def test_error_survives_pickling() -> None:
    """Errors cross process boundaries (pytest-xdist, multiprocessing) intact."""
    with pytest.raises(ProfileError) as info:
        make("links: {default: {loss: 120%}}")
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.file, copy.key, copy.value, copy.allowed, str(copy)) == (
        info.value.file,
        info.value.key,
        info.value.value,
        info.value.allowed,
        str(info.value),
    )
