"""Probe results -> per-link observations, and observations -> rows (synthetic job values, no Docker)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from squall.calibration.judge import Baseline, Evidence, judge
from squall.calibration.observations import (
    Sample,
    TransferObservation,
    better,
    parse_tcp,
    parse_tcp_rtt,
    parse_udp,
    raw_samples,
    shared_clock,
)
from squall.calibration.stalls import HOST
from squall.profiles import LinkSpec, Loss
from squall.shaping.base import LinkState

CLOCK = {"boot_id": "b", "time_ns": "time:[1]"}


def _summary(mean: float, sd: float = 10.0, count: int = 100) -> dict[str, float]:
    return {"count": count, "mean": mean, "sd": sd}


def _node(rank: int, targets: dict[int, dict[str, Any]], sources: dict[int, int], *, clock: dict[str, str] = CLOCK,
          up: float = 99.0) -> dict[str, Any]:
    return {"rank": rank, "clock": clock, "start_wall": 100.0, "server_up_wall": up,
            "targets": {str(d): t for d, t in targets.items()},
            "sources": {str(s): {"received": r, "echoed": r} for s, r in sources.items()}}


def _target(sent: int, replies: int, fwd: float, rev: float) -> dict[str, Any]:
    return {"sent": sent, "replies": replies, "rtt_us": _summary(fwd + rev), "fwd_us": _summary(fwd),
            "rev_us": _summary(rev)}


def _two_nodes(**kw: Any) -> dict[int, dict[str, Any] | None]:
    # 0 -> 1: 1000 sent, 990 reached 1, 980 echoes came back; 1 -> 0: 1000 sent, all 1000 arrived, 995 back.
    return {0: _node(0, {1: _target(1000, 980, 5000, 7000)}, {1: 1000}, **kw),
            1: _node(1, {0: _target(1000, 995, 7000, 5000)}, {0: 990})}


def test_loss_is_split_by_direction() -> None:
    obs = parse_udp(_two_nodes(), [(0, 1), (1, 0)])
    assert obs.shared_clock and not obs.problems
    # 0 -> 1 carries 0's probes (1000 sent, 990 arrived) and 0's echoes to 1 (1000 sent, 995 came back)
    assert (obs.links[(0, 1)].packets, obs.links[(0, 1)].lost) == (2000, 15)
    # 1 -> 0 carries 1's probes (1000 sent, all arrived) and 1's echoes to 0 (990 sent, 980 came back)
    assert (obs.links[(1, 0)].packets, obs.links[(1, 0)].lost) == (990 + 1000, 10 + 0)
    one_way = obs.links[(0, 1)].one_way
    assert one_way is not None and one_way.mean == pytest.approx(5000) and one_way.count == 200
    assert obs.round_trips[(0, 1)].rtt is not None and obs.round_trips[(0, 1)].rtt.mean == 12000


def test_refused_sends_never_entered_and_receive_drops_are_the_hosts() -> None:
    values = _two_nodes()
    assert values[0] is not None and values[1] is not None
    values[0]["targets"]["1"]["unsent"] = 4  # 0's kernel refused 4 of its 1000 probes to 1
    values[1]["sources"]["0"]["unechoed"] = 3  # 1's kernel refused 3 of the 990 echoes to 0
    values[1]["rx_dropped"] = {"server": 2, "client": 0}  # 1's echo server's buffer overflowed twice
    values[0]["rx_dropped"] = {"server": 0, "client": 5}  # 0's prober's buffer overflowed 5 times
    obs = parse_udp(values, [(0, 1), (1, 0)])
    # 0 -> 1: 996 of 0's probes entered (990 reached 1's server, which may have dropped 2 of them), and
    # 1000 echoes of 1's probes (995 reached 1's prober, which dropped none)
    assert (obs.links[(0, 1)].packets, obs.links[(0, 1)].lost, obs.links[(0, 1)].host_dropped) == (1996, 11, 2)
    # 1 -> 0: 1000 of 1's probes (all reached 0's server), 987 echoes of 0's probes entered and 980
    # reached 0's prober, which may have dropped 5 of them
    assert (obs.links[(1, 0)].packets, obs.links[(1, 0)].lost, obs.links[(1, 0)].host_dropped) == (1987, 7, 5)
    trip = obs.round_trips[(0, 1)]  # 0's probes to 1: up to 2 lost at 1's server and 5 at 0's prober
    assert (trip.sent, trip.replies, trip.host_dropped) == (996 - 3, 980, 2 + 5)
    assert obs.round_trips[(1, 0)].host_dropped == 0


def test_different_clocks_leave_only_round_trips() -> None:
    values = _two_nodes(clock={"boot_id": "b", "time_ns": "time:[2]"})
    assert not shared_clock({n: v for n, v in values.items() if v})
    obs = parse_udp(values, [(0, 1), (1, 0)])
    assert not obs.shared_clock and obs.links[(0, 1)].one_way is None
    assert obs.links[(0, 1)].packets == 2000  # loss needs no clock


def test_negative_legs_reveal_unshared_clocks() -> None:
    values = {0: _node(0, {1: _target(100, 100, -5000, 17000)}, {1: 100}), 1: _node(1, {}, {0: 100})}
    obs = parse_udp(values, [(0, 1)])
    assert not obs.shared_clock and "not shared" in obs.problems[0]


def test_failed_and_late_nodes_are_reported_and_their_counts_dropped() -> None:
    values = _two_nodes(up=100.5)  # node 0's server came up half a second late
    obs = parse_udp(values, [(0, 1), (1, 0)])
    assert any("came up 0.500 s" in p for p in obs.problems)
    assert obs.links[(0, 1)].packets == 0  # counts involving node 0 are not trusted
    failed = parse_udp({0: None, 1: _two_nodes()[1]}, [(0, 1), (1, 0)])
    assert "node 0: the probe job failed" in failed.problems
    assert (0, 1) not in failed.round_trips


def test_raw_samples_replace_the_summaries() -> None:
    record = {"kind": "udp_raw", "src": 0, "dst": 1, "seq": [0, 1], "send_ns": [0, 2_000_000],
              "server_ns": [5_000_000, 7_100_000], "recv_ns": [12_000_000, 14_000_000], "wall_offset_ns": 10**18}
    raw = raw_samples([record, {"kind": "other"}])
    assert raw[(0, 1)] == [Sample(0, 1e9, 5000.0, 7000.0, 12000.0), Sample(1, 1e9 + 0.002, 5100.0, 6900.0, 12000.0)]
    obs = parse_udp(_two_nodes(), [(0, 1), (1, 0)], raw)
    assert obs.links[(0, 1)].one_way_samples[:2] == (5000.0, 5100.0)
    assert obs.round_trips[(0, 1)].rtt_samples == (12000.0, 12000.0)


def test_transfers_are_matched_by_index() -> None:
    values = {0: {"sent": [{"index": 0, "mss": 1448}], "received": [{"index": 1, "goodput_bps": 9.5e6, "window_s": 1.0,
                                                                      "mss": 1448}]},
              1: {"sent": [{"index": 1, "mss": 1448}], "received": [{"index": 0, "error": "reset"}]},
              2: None}
    out = parse_tcp(values, [(0, 1), (1, 0), (0, 2)])
    assert out[(1, 0)] == TransferObservation((1, 0), 9.5e6, 1448, 1.0, None)
    assert out[(0, 1)].error == "reset"
    assert out[(0, 2)].error == "the job failed on receiver 2"


def test_tcp_round_trips() -> None:
    out = parse_tcp_rtt({0: {"targets": {"1": {"rtt_us": _summary(10_000)}, "2": {"error": "refused"}}}, 1: None},
                        [(0, 1), (0, 2), (1, 0)])
    assert list(out) == [(0, 1)] and out[(0, 1)].rtt is not None and out[(0, 1)].rtt.mean == 10_000


def _state(loss01: float = 0.0, blocked: frozenset[tuple[int, int]] = frozenset()) -> LinkState:
    return LinkState({(0, 1): LinkSpec(delay_us=5000, loss=Loss(loss01), rate_bps=10_000_000),
                      (1, 0): LinkSpec(delay_us=7000)}, {}, blocked)


def _evidence(values: Mapping[int, dict[str, Any] | None], **kw: Any) -> Evidence:
    obs = parse_udp(values, [(0, 1), (1, 0)])
    return Evidence(Baseline(0.0, 10.0, 0.0, 14.0, 100), obs, kw.pop("transfers", {}), **kw)


def _big_two_nodes(clock: dict[str, str] = CLOCK) -> dict[int, dict[str, Any] | None]:
    return {0: _node(0, {1: _target(1000, 1000, 5000, 7000)}, {1: 1000}, clock=clock),
            1: _node(1, {0: _target(1000, 1000, 7000, 5000)}, {0: 1000}, clock=clock)}


def test_judge_one_way_rows() -> None:
    transfers = {(0, 1): TransferObservation((0, 1), 9.56e6, 1448, 1.0, None)}
    rows = judge(_state(), ((0, 1), (1, 0)), _evidence(_big_two_nodes(), transfers=transfers), loss_confidence=0.99,
                 policy=HOST)
    assert [(r.link, r.metric, r.verdict) for r in rows] == [
        ((0, 1), "delay", "passed"), ((0, 1), "jitter", "passed"),
        ((0, 1), "loss", "passed"), ((0, 1), "rate", "passed"),
        ((1, 0), "delay", "passed"), ((1, 0), "jitter", "passed"),
        ((1, 0), "loss", "passed")]


def test_judge_round_trip_rows_without_a_shared_clock() -> None:
    values = _big_two_nodes(clock={"boot_id": "b", "time_ns": "time:[2]"})
    values[1]["clock"] = CLOCK  # type: ignore[index]
    rows = judge(_state(), ((0, 1),), _evidence(values), loss_confidence=0.99, policy=HOST)
    assert [(r.metric, r.verdict) for r in rows] == [
        ("rtt", "passed"), ("rtt_jitter", "passed"),
        ("loss", "passed"), ("rate", "unknown")]
    assert rows[0].configured == 12.0  # 5 ms there + 7 ms back


def test_judge_blocked_link_expects_total_loss() -> None:
    values = {0: _node(0, {1: _target(1000, 0, 0, 0)}, {}), 1: _node(1, {}, {0: 0})}
    rows = judge(_state(blocked=frozenset({(0, 1)})), ((0, 1),), _evidence(values), loss_confidence=0.99, policy=HOST)
    assert [(r.metric, r.verdict, r.configured) for r in rows] == [("loss", "passed", 100.0)]


def test_judge_without_any_probe_data_is_unknown_not_passed() -> None:
    evidence = Evidence(Baseline(0, 0, 0, 0, 0), None, {})
    rows = judge(_state(), ((0, 1),), evidence, loss_confidence=0.99, policy=HOST)
    assert {r.verdict for r in rows} == {"unknown"}


def test_baseline_pools_links_and_round_trips() -> None:
    base = Baseline.from_udp(parse_udp(_big_two_nodes(), [(0, 1), (1, 0)]), HOST)
    assert base.one_way_mean_us == pytest.approx(6000) and base.rtt_mean_us == pytest.approx(12000)
    assert base.samples == 200
    assert Baseline.from_udp(None, HOST) == Baseline(0.0, 0.0, 0.0, 0.0, 0)


def test_the_better_of_two_transfers_counts() -> None:
    low, high = (TransferObservation((0, 1), g, 1448, 1.0, None) for g in (800e6, 950e6))
    failed = TransferObservation((0, 1), None, None, None, "reset")
    assert better(low, high) is high and better(high, low) is high
    assert better(low, failed) is low and better(failed, low) is low and better(low, None) is low
