"""A node's shared uplink in calibration: planned as one transfer to every peer at once, judged summed."""

from __future__ import annotations

from pathlib import Path

from squall.calibration.judge import uplink_row
from squall.calibration.observations import TransferObservation
from squall.calibration.plan import MAX_UPLINKS, fan_out_rate_bps, fan_outs, plan_probes
from squall.calibration.report import link_text
from squall.calibration.stalls import StallPolicy
from squall.checks.verdict import Validity
from squall.profiles import load_profile
from squall.shaping import state_at
from squall.shaping.base import LinkState

ACCESS = """name: access
description: every node on a 20 Mbit/s uplink
links:
  default: {delay: 5ms}
  nodes:
    - {nodes: all, uplink: 20mbit}
"""
MIXED = """name: mixed
description: nodes 0-2 on 100 Mbit/s uplinks, node 3 on 20 Mbit/s up and 10 Mbit/s down
links:
  default: {delay: 5ms}
  nodes:
    - {nodes: [0, 1, 2], uplink: 100mbit}
    - {nodes: 3, uplink: 20mbit, downlink: 10mbit}
"""


def _state(tmp_path: Path, text: str, n: int = 4) -> LinkState:
    path = tmp_path / "access.yaml"
    path.write_text(text)
    return state_at(load_profile(str(path)), n, 0.0)


def test_a_node_with_an_uplink_sends_to_every_peer_at_once(tmp_path: Path) -> None:
    state = _state(tmp_path, ACCESS)
    plan = plan_probes(state, 4)
    assert len(plan.uplinks) == 1  # every node has the same cap: one of them stands for all
    (group,) = plan.uplinks
    assert [t.link for t in group] == [(0, 1), (0, 2), (0, 3)]
    assert {t.at_s for t in group} == {0.0} and len({(t.seconds, t.warmup_s) for t in group}) == 1
    assert fan_out_rate_bps(state, group) == 20_000_000  # the cap, not 3 x 20 Mbit/s
    assert plan.tcp_seconds > max(t.at_s + t.seconds for t in plan.transfers)
    assert any("shared uplink of node(s) 0" in note for note in plan.notes)


def test_what_the_peers_links_allow_together_bounds_the_total(tmp_path: Path) -> None:
    state = _state(tmp_path, MIXED)
    groups = fan_outs(state, 4, [(0, 1)], 1.0)
    assert len(groups) == 2 <= MAX_UPLINKS  # two distinct caps: nodes 0 (100 Mbit/s) and 3 (20 Mbit/s)
    by_node = {g[0].link[0]: g for g in groups}
    # node 0's peers: 1 and 2 take the uplink's 100 Mbit/s each alone, 3 only its 10 Mbit/s downlink
    assert fan_out_rate_bps(state, by_node[0]) == 100_000_000
    assert fan_out_rate_bps(state, by_node[3]) == 20_000_000


def test_no_uplink_no_fan_out(tmp_path: Path) -> None:
    assert plan_probes(state_at(load_profile("thin-20mbit"), 4, 0.0), 4).uplinks == ()
    two = _state(tmp_path, ACCESS, n=2)  # one peer: the transfer alone already measures it
    assert fan_outs(two, 2, [(0, 1)], 1.0) == ()


def test_the_row_adds_up_the_peers_and_fails_a_cap_that_is_not_shared(tmp_path: Path) -> None:
    state = _state(tmp_path, ACCESS)
    (group,) = plan_probes(state, 4).uplinks
    policy = StallPolicy()

    def seen(mbit: float) -> dict[tuple[int, int], TransferObservation]:
        return {t.link: TransferObservation(t.link, mbit * 1e6, 1448, 1.0, None) for t in group}

    shared = uplink_row(state, group, seen(6.4), policy=policy)
    assert shared.metric == "uplink" and shared.link == (0, 0) and link_text(shared) == "0->*"
    assert shared.validity is Validity.PASS, shared.why
    assert shared.why.startswith("node 0 to 1, 2, 3 at once (6.40, 6.40, 6.40 Mbit/s of payload)")
    per_peer = uplink_row(state, group, seen(19.0), policy=policy)  # each peer got the whole uplink
    assert per_peer.validity is Validity.FAIL and per_peer.measured is not None and per_peer.measured > 50
    lost = {**seen(6.4), (0, 2): TransferObservation((0, 2), None, None, None, "no connection arrived")}
    unknown = uplink_row(state, group, lost, policy=policy)
    assert unknown.validity is Validity.UNKNOWN and "2: no connection arrived" in unknown.why
