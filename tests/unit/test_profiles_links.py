"""Link resolution: scopes and their precedence, asymmetric pairs, regions, selectors, phases."""

from __future__ import annotations

import textwrap

import pytest

from squall.profiles import (
    Chance,
    Distribution,
    GilbertElliott,
    Jitter,
    LinkSpec,
    Loss,
    NodeLinkSpec,
    Profile,
    parse_profile,
)

HEAD = "name: t\ndescription: a test profile\n"


def make(body: str) -> Profile:
    return parse_profile(HEAD + textwrap.dedent(body), source="t.yaml")


SCOPES = make(
    """
    regions: {eu: "0-1", us: "2-3"}
    links:
      default: {delay: 1ms, rate: 1gbit, loss: {percent: 1%, correlation: 25%}}
      inside:
        us: {delay: 2ms}
      between:
        - {link: "eu <-> us", delay: 40ms}
        - {link: "us -> eu", rate: 100mbit}
      nodes:
        - {nodes: 4, egress: {delay: 7ms, rate: 50mbit}, ingress: {rate: 20mbit}}
        - {nodes: 1, ingress: {rate: 500mbit, limit: 100}}
      pairs:
        - {link: "0 <-> 2", delay: 30ms}
        - {link: "2 -> 0", delay: 60ms, loss: 5%}
    """
)


@pytest.mark.parametrize(
    ("src", "dst", "delay_us", "rate_bps", "loss"),
    [
        pytest.param(1, 0, 1_000, 1_000_000_000, Loss(0.01, 0.25), id="inside-eu-gets-default"),
        pytest.param(0, 1, 1_000, 500_000_000, Loss(0.01, 0.25), id="node-ingress-beats-default"),
        pytest.param(2, 3, 2_000, 1_000_000_000, Loss(0.01, 0.25), id="inside-us-overrides-delay"),
        pytest.param(1, 3, 40_000, 1_000_000_000, Loss(0.01, 0.25), id="between-symmetric"),
        pytest.param(3, 0, 40_000, 100_000_000, Loss(0.01, 0.25), id="between-directed-adds-rate"),
        pytest.param(3, 1, 40_000, 500_000_000, Loss(0.01, 0.25), id="node-ingress-beats-between"),
        pytest.param(0, 2, 30_000, 1_000_000_000, Loss(0.01, 0.25), id="pair-symmetric-beats-between"),
        pytest.param(2, 0, 60_000, 100_000_000, Loss(0.05, 0.0), id="pair-directed-beats-symmetric"),
        pytest.param(4, 0, 7_000, 50_000_000, Loss(0.01, 0.25), id="node-egress-outside-regions"),
        pytest.param(0, 4, 1_000, 20_000_000, Loss(0.01, 0.25), id="node-ingress"),
        pytest.param(4, 1, 7_000, 50_000_000, Loss(0.01, 0.25), id="egress-and-ingress-rate-take-min"),
    ],
)
def test_scope_precedence(src: int, dst: int, delay_us: int, rate_bps: int, loss: Loss) -> None:
    spec = SCOPES.link(src, dst, 5)
    assert (spec.delay_us, spec.rate_bps, spec.loss) == (delay_us, rate_bps, loss)


def test_egress_and_ingress_rates_take_the_smaller() -> None:
    profile = make(
        """
        links:
          nodes:
            - {nodes: 0, egress: {rate: 100mbit, limit: 50}}
            - {nodes: 1, ingress: {rate: 20mbit, limit: 500}}
        """
    )
    assert (profile.link(0, 1, 2).rate_bps, profile.link(0, 1, 2).limit_packets) == (20_000_000, 50)
    assert profile.explain(0, 1, 2) == {
        "rate_bps": "links.nodes[1].ingress.rate",
        "limit_packets": "links.nodes[0].egress.limit",
    }
    assert profile.link(1, 0, 2) == LinkSpec()


def test_explain_names_the_key_that_set_each_field() -> None:
    assert SCOPES.explain(2, 0, 5) == {
        "delay_us": "links.pairs[1].delay",
        "rate_bps": "links.between[1].rate",
        "loss": "links.pairs[1].loss",
    }


def test_a_key_is_replaced_as_a_whole() -> None:
    """A pair's `loss: 5%` drops the default loss correlation; its `delay` leaves the default jitter alone."""
    profile = make(
        """
        links:
          default: {delay: 1ms, jitter: 100us, loss: {percent: 1%, correlation: 50%}}
          pairs: [{link: "0 -> 1", delay: 9ms, loss: 5%}]
        """
    )
    spec = profile.link(0, 1, 2)
    assert spec == LinkSpec(delay_us=9_000, jitter=Jitter(100), loss=Loss(0.05))
    assert profile.link(1, 0, 2) == LinkSpec(delay_us=1_000, jitter=Jitter(100), loss=Loss(0.01, 0.5))


def test_asymmetric_pairs() -> None:
    profile = make(
        """
        links:
          pairs:
            - {link: "0 -> 1", delay: 10ms, rate: 20mbit}
            - {link: "1 -> 0", delay: 30ms, rate: 100mbit}
        """
    )
    assert (profile.link(0, 1, 3).delay_us, profile.link(0, 1, 3).rate_bps) == (10_000, 20_000_000)
    assert (profile.link(1, 0, 3).delay_us, profile.link(1, 0, 3).rate_bps) == (30_000, 100_000_000)
    assert profile.link(0, 2, 3) == LinkSpec()


def test_no_links_section_means_perfect_links() -> None:
    profile = make("")
    links = profile.links(3)
    assert set(links) == {(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)}
    assert all(spec == LinkSpec() and not spec.impaired for spec in links.values())


def test_two_regions_one_ms_inside_forty_between() -> None:
    profile = make(
        """
        regions: {a: part 1/2, b: part 2/2}
        links:
          inside: {a: {delay: 1ms}, b: {delay: 1ms}}
          between: [{link: "a <-> b", delay: 40ms}]
        """
    )
    n = 6
    for (src, dst), spec in profile.links(n).items():
        same = (src < 3) == (dst < 3)
        assert spec.delay_us == (1_000 if same else 40_000), (src, dst)
    assert [profile.region_of(i, n) for i in range(n)] == ["a", "a", "a", "b", "b", "b"]


def test_nodes_in_no_region_get_the_default() -> None:
    profile = make(
        """
        regions: {a: 0, b: 1}
        links:
          default: {delay: 3ms}
          between: [{link: "a <-> b", delay: 40ms}]
        """
    )
    assert profile.link(0, 1, 3).delay_us == 40_000
    assert profile.link(0, 2, 3).delay_us == 3_000
    assert profile.region_of(2, 3) is None


@pytest.mark.parametrize(
    ("selector", "n", "nodes"),
    [
        ("0", 4, {0}),
        ("-1", 4, {3}),
        ("last", 4, {3}),
        ("first", 4, {0}),
        ("all", 3, {0, 1, 2}),
        ("odd", 6, {1, 3, 5}),
        ("even", 5, {0, 2, 4}),
        ("1-2", 4, {1, 2}),
        ("2-last", 5, {2, 3, 4}),
        ("first-1", 5, {0, 1}),
        ("part 1/2", 5, {0, 1}),
        ("part 2/2", 5, {2, 3, 4}),
        ("part 3/3", 9, {6, 7, 8}),
        ("part 2/3", 2, {0}),
        ("0, 2", 4, {0, 2}),
        ("[0, last]", 4, {0, 3}),
        ("[odd, 0]", 4, {0, 1, 3}),
    ],
)
def test_selectors(selector: str, n: int, nodes: set[int]) -> None:
    value = selector if selector.startswith("[") else f'"{selector}"'
    profile = make(f"devices: {{nodes: [{{nodes: {value}, slowdown: 2}}]}}")
    slow = {node for node in range(n) if profile.device(node, n).slowdown == 2}
    assert slow == nodes


def test_selector_pairs_cover_every_combination() -> None:
    profile = make('links: {pairs: [{link: "part 1/2 -> part 2/2", delay: 5ms}]}')
    delayed = {link for link, spec in profile.links(4).items() if spec.delay_us}
    assert delayed == {(0, 2), (0, 3), (1, 2), (1, 3)}


def test_directed_pair_overrides_symmetric_one_key_by_key() -> None:
    profile = make(
        """
        links:
          pairs:
            - {link: "0 <-> 1", delay: 10ms, loss: 1%}
            - {link: "1 -> 0", delay: 20ms}
        """
    )
    assert profile.link(0, 1, 2) == LinkSpec(delay_us=10_000, loss=Loss(0.01))
    assert profile.link(1, 0, 2) == LinkSpec(delay_us=20_000, loss=Loss(0.01))


def test_every_setting_parses() -> None:
    profile = make(
        """
        links:
          default:
            delay: 20ms
            jitter: {amount: 5ms, distribution: paretonormal, correlation: 10%}
            loss: {gemodel: {p: 1%, r: 25%}}
            duplicate: {percent: 0.5%, correlation: 5%}
            reorder: {percent: 25%, correlation: 50%}
            rate: 10mbps
            limit: 5000p
        """
    )
    assert profile.link(0, 1, 2) == LinkSpec(
        delay_us=20_000,
        jitter=Jitter(5_000, Distribution.PARETONORMAL, 0.1),
        loss=Loss(gemodel=GilbertElliott(0.01, 0.25, 1.0, 0.0)),
        duplicate=Chance(0.005, 0.05),
        reorder=Chance(0.25, 0.5),
        rate_bps=80_000_000,
        limit_packets=5000,
    )


def test_gilbert_elliott_mean_loss() -> None:
    assert GilbertElliott(0.01, 0.24).mean_loss == pytest.approx(0.04)
    assert GilbertElliott(0.01, 0.24, loss_bad=0.5, loss_good=0.01).mean_loss == pytest.approx(
        0.04 * 0.5 + 0.96 * 0.01
    )
    assert Loss(gemodel=GilbertElliott(0.01, 0.24)).mean == pytest.approx(0.04)


def test_to_dict_is_plain_data() -> None:
    data = LinkSpec(delay_us=5, jitter=Jitter(1, Distribution.NORMAL)).to_dict()
    assert data["jitter"] == {"amount_us": 1, "distribution": "normal", "correlation": 0.0}
    assert data["rate_bps"] is None


def test_shared_node_rates() -> None:
    profile = make(
        """
        links:
          nodes:
            - {nodes: odd, uplink: 20mbit, downlink: 100mbit}
        phases:
          - at: 10s
            links: {nodes: [{nodes: 1, uplink: 5mbit}]}
        """
    )
    assert profile.node_link(1, 4) == NodeLinkSpec(20_000_000, 100_000_000)
    assert profile.node_link(0, 4) == NodeLinkSpec()
    assert profile.node_link(1, 4, at=10.0) == NodeLinkSpec(5_000_000, 100_000_000)
    assert profile.node_link(3, 4, at=10.0) == NodeLinkSpec(20_000_000, 100_000_000)


PHASED = make(
    """
    links:
      default: {delay: 5ms, rate: 1gbit}
      pairs: [{link: "0 -> 1", delay: 9ms}]
    phases:
      - {at: 30s, name: lossy, links: {default: {loss: 10%}}}
      - {at: 60s, name: slow, links: {default: {delay: 100ms}}}
      - {at: 90s}
    """
)


@pytest.mark.parametrize(
    ("at", "src", "delay_us", "loss", "phase"),
    [
        pytest.param(0.0, 1, 5_000, 0.0, None, id="base"),
        pytest.param(29.999, 1, 5_000, 0.0, None, id="just-before-first-phase"),
        pytest.param(30.0, 1, 5_000, 0.1, "lossy", id="phase-starts-at-its-time"),
        pytest.param(30.0, 0, 9_000, 0.1, "lossy", id="phase-keeps-base-pair-delay"),
        pytest.param(60.0, 1, 100_000, 0.0, "slow", id="not-cumulative-loss-gone"),
        pytest.param(60.0, 0, 100_000, 0.0, "slow", id="phase-default-beats-base-pair"),
        pytest.param(90.0, 0, 9_000, 0.0, "", id="empty-phase-returns-to-base"),
        pytest.param(1e9, 1, 5_000, 0.0, "", id="last-phase-holds-forever"),
    ],
)
def test_phases(at: float, src: int, delay_us: int, loss: float, phase: str | None) -> None:
    dst = 1 if src == 0 else 2
    spec = PHASED.link(src, dst, 3, at=at)
    assert (spec.delay_us, spec.loss.probability, spec.rate_bps) == (delay_us, loss, 1_000_000_000)
    active = PHASED.phase_at(at)
    assert (active.name if active else None) == phase


def test_change_times_and_links_at_time() -> None:
    assert PHASED.change_times() == (30.0, 60.0, 90.0)
    assert all(spec.loss.probability == 0.1 for spec in PHASED.links(4, at=45.0).values())
    assert len(PHASED.links(4, at=45.0)) == 12


def test_phase_regions_and_explain() -> None:
    assert PHASED.explain(0, 1, 2, at=61.0)["delay_us"] == "phases[1].links.default.delay"
    assert PHASED.explain(0, 1, 2, at=31.0) == {
        "delay_us": "links.pairs[0].delay",
        "rate_bps": "links.default.rate",
        "loss": "phases[0].links.default.loss",
    }
