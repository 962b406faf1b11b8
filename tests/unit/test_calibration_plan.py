"""Probe planning: which links, how many probes, the transfer schedule."""

from __future__ import annotations

import pytest

from squall.calibration.expected import loss_model
from squall.calibration.plan import MAX_COUNT, MIN_COUNT, QUICK_MIN_COUNT, plan_probes, reschedule
from squall.calibration.verdicts import LOSS_RESOLUTION, check_loss, loss_packets_needed
from squall.checks.verdict import Validity
from squall.profiles import Profile, load_profile
from squall.shaping import state_at
from squall.shaping.base import LinkState


def _state(profile: str | Profile, n: int) -> LinkState:
    return state_at(load_profile(profile) if isinstance(profile, str) else profile, n, 0.0)


def test_small_clusters_check_every_link() -> None:
    plan = plan_probes(_state("wan-5ms", 4), 4)
    assert len(plan.links) == 12 and len(set(plan.links)) == 12
    assert plan.udp_count == MIN_COUNT
    assert [t.link for t in plan.transfers] == list(plan.links)  # every link has a rate


def test_a_lossy_profile_gets_enough_packets_after_the_echoes_lost_on_the_way_back() -> None:
    state = _state("lossy-1pct", 4)
    plan = plan_probes(state, 4)
    needed = loss_packets_needed(loss_model(state.links[(0, 1)].loss), plan.loss_confidence)
    expected_on_link = plan.udp_count * (1 + 0.99)  # own probes + echoes that survived the reverse link
    assert expected_on_link >= 1.04 * needed


@pytest.mark.parametrize("quick", [False, True])
def test_the_packets_planned_resolve_the_loss_check_the_judge_makes(quick: bool) -> None:
    """The plan sizes the probe for a resolution and the judge checks that same one: a quick
    calibration of lossy-1pct once sent 500 probes per link (~1000 crossing) to a check asking 3119."""
    state = _state("lossy-1pct", 4)
    plan = plan_probes(state, 4, quick=quick)
    model = loss_model(state.links[(0, 1)].loss)
    crossing = int(plan.udp_count * (1 + 0.99))  # own probes + echoes that survived the reverse link
    row = check_loss((0, 1), model, crossing, round(crossing * model.mean), confidence=plan.loss_confidence,
                     resolution=plan.loss_resolution)
    assert row.validity is Validity.PASS, row.why
    assert plan.loss_resolution == (2 * LOSS_RESOLUTION if quick else LOSS_RESOLUTION)


def test_loss_checks_share_a_one_percent_budget() -> None:
    plan = plan_probes(_state("lossy-1pct", 4), 4)
    assert 1 - plan.loss_confidence ** 12 == pytest.approx(0.01)


def test_bursty_loss_is_capped_and_says_so() -> None:
    plan = plan_probes(_state("bursty-loss", 4), 4)
    assert MIN_COUNT < plan.udp_count <= MAX_COUNT
    assert plan.udp_seconds < 25


def test_quick_asks_for_a_quarter_of_the_loss_packets() -> None:
    full, quick = plan_probes(_state("bursty-loss", 4), 4), plan_probes(_state("bursty-loss", 4), 4, quick=True)
    assert quick.udp_count == pytest.approx(full.udp_count / 4, rel=0.01)
    assert quick.tcp_seconds < full.tcp_seconds
    assert plan_probes(_state("wan-5ms", 4), 4, quick=True).udp_count == QUICK_MIN_COUNT


def test_large_clusters_are_sampled_covering_every_kind_of_pair() -> None:
    state = _state("geo-2-regions", 8)
    plan = plan_probes(state, 8, seed=3)
    assert len(plan.links) == 12
    assert all((d, s) in plan.links for s, d in plan.links)  # both directions of each chosen pair
    regions = {(s < 4) == (d < 4) for s, d in plan.links}
    assert regions == {True, False}  # a link inside a region and one between regions
    assert plan.links == plan_probes(state, 8, seed=3).links
    assert any("sampled 12 of 56" in note for note in plan.notes)


def test_named_pairs_are_checked_as_given() -> None:
    plan = plan_probes(_state("wan-5ms", 4), 4, pairs=[(0, 1), (2, 3), (0, 1)])
    assert plan.links == ((0, 1), (2, 3))
    with pytest.raises(ValueError, match="not a link"):
        plan_probes(_state("wan-5ms", 4), 4, pairs=[(0, 4)])
    with pytest.raises(ValueError, match="empty"):
        plan_probes(_state("wan-5ms", 4), 4, pairs=[])
    with pytest.raises(ValueError, match="no links"):
        plan_probes(_state("wan-5ms", 1), 1)


def test_transfers_do_not_overlap_and_warm_up_longer_on_long_fat_links() -> None:
    plan = plan_probes(_state("wan-50ms-100mbit", 3), 3)
    ends = [t.at_s + t.seconds for t in plan.transfers]
    assert all(nxt.at_s > end for end, nxt in zip(ends, plan.transfers[1:], strict=False))
    assert all(0.3 <= t.warmup_s < t.seconds for t in plan.transfers)
    lan = plan_probes(_state("wan-5ms", 3), 3)
    assert plan.transfers[0].warmup_s > 2 * lan.transfers[0].warmup_s
    assert plan.udp_wait_s > 0.6  # 100 ms round trips + 6 s.d. + 0.5 s


def test_links_without_a_rate_get_no_transfer() -> None:
    from squall.profiles import profile_from_data

    profile = profile_from_data({"name": "x", "description": "x", "links": {
        "default": {"delay": "1ms"}, "pairs": [{"link": "0 -> 1", "rate": "10mbit"}]}})
    plan = plan_probes(_state(profile, 3), 3)
    assert [t.link for t in plan.transfers] == [(0, 1)]
    assert plan.transfers[0].to_config() == {"src": 0, "dst": 1, "at_s": 0.0, "seconds": 1.3, "warmup_s": 0.3}


def test_blocked_links_get_no_transfer_and_unchecked_settings_are_noted() -> None:
    from squall.profiles import profile_from_data

    profile = profile_from_data({"name": "x", "description": "x", "links": {
        "default": {"delay": "5ms", "rate": "100mbit", "duplicate": "1%"}}, "churn": {"events": [
            {"at": "0s", "kind": "link_down", "link": "0 -> 1"}]}})
    plan = plan_probes(_state(profile, 2), 2)
    assert [t.link for t in plan.transfers] == [(1, 0)]
    assert "duplication configured but not checked" in plan.notes


def test_reschedule_packs_a_subset_back_to_back() -> None:
    plan = plan_probes(_state("thin-20mbit", 3), 3)
    again = reschedule([plan.transfers[3], plan.transfers[1]])
    assert [t.link for t in again] == [plan.transfers[3].link, plan.transfers[1].link]
    assert again[0].at_s == 0.0 and again[1].at_s == pytest.approx(plan.transfers[3].slot_s)
    assert again[1].at_s > again[0].seconds


def test_links_into_a_nat_are_opened_by_the_node_behind_it_and_links_between_two_nats_left_out() -> None:
    """Node 1 and node 2 behind NATs of their own: 0->1 and 0->2 are probed through the way the node
    behind the NAT opens; 1<->2 carry nothing (neither can open the other) and are not checked."""
    base = _state("wan-5ms", 3)
    state = LinkState(base.links, nat=((1,), (2,)))
    plan = plan_probes(state, 3)
    assert set(plan.links) == {(0, 1), (1, 0), (0, 2), (2, 0)}
    assert set(plan.punch) == {(0, 1), (0, 2)}
    assert {t.link: t.dial_back for t in plan.transfers} == {(0, 1): True, (1, 0): False, (0, 2): True,
                                                              (2, 0): False}
    assert {t.link: t.to_config().get("dial_back") for t in plan.transfers}[(0, 1)] is True
    assert "dial_back" not in next(t for t in plan.transfers if t.link == (1, 0)).to_config()
    assert any("between nodes behind different NATs" in n for n in plan.notes)
    with pytest.raises(ValueError, match="neither can open a connection"):
        plan_probes(state, 3, pairs=[(1, 2)])
