"""Unit conversion: LinkSpec (percent, us) -> LinkParams (fractions) and netem leaves; limits and bursts."""

from __future__ import annotations

import pytest

from squall.profiles import Chance, GilbertElliott, Jitter, LinkSpec, Loss
from squall.profiles.model import Distribution
from squall.shaping.base import ShapingError
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import needs_netem, netem_qdisc, queue_limit
from squall.shaping.nfqueue.config import GilbertElliott as DaemonGE
from squall.shaping.nfqueue.config import LinkParams
from squall.shaping.nfqueue.plan import delays_in_daemon, fifo_limit, link_params
from squall.shaping.planning.checks import burst_bytes, check_spec

PARAMS = [
    pytest.param(LinkSpec(), LinkParams(), id="perfect"),
    pytest.param(LinkSpec(delay_us=20_000), LinkParams(delay_us=20_000), id="delay"),
    pytest.param(
        LinkSpec(delay_us=5000, jitter=Jitter(1000, Distribution.NORMAL, 0.25)),
        LinkParams(delay_us=5000, jitter_us=1000, distribution="normal", jitter_correlation=0.25),
        id="jitter",
    ),
    pytest.param(LinkSpec(loss=Loss(0.05, 0.5)), LinkParams(loss=0.05, loss_correlation=0.5), id="loss"),
    pytest.param(
        LinkSpec(loss=Loss(gemodel=GilbertElliott(0.01, 0.1, 0.8, 0.02))),
        LinkParams(gilbert_elliott=DaemonGE(p=0.01, r=0.1, loss_bad=0.8, loss_good=0.02)),
        id="gemodel",
    ),
    pytest.param(
        LinkSpec(delay_us=1000, reorder=Chance(0.25, 0.5)),
        LinkParams(delay_us=1000, reorder=0.25, reorder_correlation=0.5),
        id="reorder",
    ),
    pytest.param(LinkSpec(rate_bps=10**6, duplicate=Chance(0.03)), LinkParams(), id="rate-and-duplicate-not-daemon"),
]


@pytest.mark.parametrize(("spec", "params"), PARAMS)
def test_link_params(spec: LinkSpec, params: LinkParams) -> None:
    got = link_params(spec)
    assert got == params  # x / 100 of these percentages is the same float as the literal fraction
    assert delays_in_daemon(got) == (params != LinkParams())


def test_netem_leaf_keeps_percent_and_microseconds() -> None:
    spec = LinkSpec(
        delay_us=50_000,
        jitter=Jitter(2000, Distribution.PARETONORMAL, 0.1),
        loss=Loss(0.015, 0.2),
        duplicate=Chance(0.005),
        reorder=Chance(0.02, 0.3),
    )
    assert netem_qdisc(spec, 100_000_000) == Netem(
        delay_us=50_000,
        jitter_us=2000,
        distribution="paretonormal",
        delay_corr=0.1,
        loss=0.015,
        loss_corr=0.2,
        duplicate=0.005,
        reorder=0.02,
        reorder_corr=0.3,
        limit=10_000,  # 100 Mbit/s x 56 ms x 2 / 12 kbit = 934 < floor
    )


LIMITS = [
    pytest.param(LinkSpec(), None, 10_000, 10_000, id="floor"),
    pytest.param(LinkSpec(limit_packets=123), 10**9, 10_000, 123, id="profile-wins"),
    pytest.param(LinkSpec(delay_us=100_000), 10**9, 10_000, 16_667, id="1gbit-100ms"),
    pytest.param(LinkSpec(delay_us=100_000), None, 10_000, 166_667, id="unlimited-uses-10gbit"),
    pytest.param(LinkSpec(delay_us=10_000, jitter=Jitter(10_000)), 10**9, 1_000, 6_667, id="jitter-counts-3x"),
]


@pytest.mark.parametrize(("spec", "rate", "floor", "expected"), LIMITS)
def test_queue_limit(spec: LinkSpec, rate: int | None, floor: int, expected: int) -> None:
    assert queue_limit(spec, rate, floor) == expected


def test_fifo_limit_depends_on_rate_only() -> None:
    assert fifo_limit(LinkSpec(delay_us=10**6), 10**7) == 1_000
    assert fifo_limit(LinkSpec(), 10**9) == 16_667  # 200 ms at 1 Gbit/s in 1500-byte packets
    assert fifo_limit(LinkSpec(limit_packets=50), 10**9) == 50


def test_burst_is_one_ms_with_a_floor() -> None:
    assert burst_bytes(8_000_000) == 16_384
    assert burst_bytes(1_000_000_000) == 125_000
    assert burst_bytes(100_000_000_000) == 12_500_000


def test_needs_netem() -> None:
    assert not needs_netem(LinkSpec())
    assert not needs_netem(LinkSpec(limit_packets=5))
    assert needs_netem(LinkSpec(rate_bps=1000))
    assert needs_netem(LinkSpec(loss=Loss(gemodel=GilbertElliott(0.01, 0.1))))


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (LinkSpec(jitter=Jitter(-1)), "jitter must be an integer"),
        (LinkSpec(loss=Loss(0.01, 1.0)), r"loss correlation must be in \[0, 1\)"),
        (LinkSpec(loss=Loss(0.01, gemodel=GilbertElliott(0.01, 0.01))), "two loss models"),
        (LinkSpec(loss=Loss(gemodel=GilbertElliott(0.0, 0.0))), "p \\+ r > 0"),
        (LinkSpec(limit_packets=0), "bad limit_packets"),
        (LinkSpec(delay_us=1.5), "delay_us must be an integer"),  # type: ignore[arg-type]
    ],
)
def test_check_spec_rejects(spec: LinkSpec, why: str) -> None:
    with pytest.raises(ShapingError, match=why):
        check_spec(spec, "link 0 -> 1")
