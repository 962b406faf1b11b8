"""lossy_sgd's pure parts: the estimators (claim T7.1 over 10^4 seeded trials), the packet layout, the
inbox's bookkeeping and the options. The hostile-datagram cases are in test_protocol_lossy_sgd_decoder.py, the
in-process runs over loopback UDP in test_protocol_lossy_sgd_train.py."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from squall.protocols.catalog import lookup
from squall.protocols.lossy_sgd.estimator import own_weight, reconstruct, trial_estimates, zero_fill_factor
from squall.protocols.lossy_sgd.inbox import Inbox
from squall.protocols.lossy_sgd.options import LossyOptions
from squall.protocols.lossy_sgd.packets import Layout, Packet, Phase, datagram_bytes, encode_packets
from squall.protocols.lossy_sgd.protocol import NAME, NORESYNC
from squall.training.options import read_options
from squall.wire import HEADER_SIZE, MTU_DATAGRAM

N, P, TRIALS = 8, 0.1, 10_000


def blocks(seed: int = 7, dim: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(N, dim))


def within_3_se(estimates: np.ndarray, truth: np.ndarray) -> tuple[bool, np.ndarray]:
    se = estimates.std(axis=0, ddof=1) / math.sqrt(len(estimates))
    z = np.abs(estimates.mean(axis=0) - truth) / se
    return bool((z <= 3).all()), z


# -- estimators (T7.1) ---------------------------------------------------------------------------------------
def test_inverse_probability_weighting_is_unbiased() -> None:
    g = blocks()
    ok, z = within_3_se(trial_estimates(g, P, TRIALS, estimator="inverse_probability", seed=1), g.mean(0))
    assert ok, z


def test_received_mean_is_unbiased_when_every_contribution_is_lost_alike() -> None:
    g = blocks()
    ok, z = within_3_se(trial_estimates(g, P, TRIALS, estimator="received_mean", seed=2, symmetric=True), g.mean(0))
    assert ok, z


def test_received_mean_weights_the_owners_own_block_by_its_expected_share() -> None:
    g = np.zeros((N, 1))
    g[0] = 1.0  # the estimate is then the owner's weight
    est = trial_estimates(g, P, TRIALS, estimator="received_mean", seed=3)
    ok, z = within_3_se(est, np.array([own_weight(N, P)]))
    assert ok, z
    assert own_weight(N, P) == pytest.approx(0.13889, abs=1e-5)  # not 1/8: biased towards the owner's batch
    assert own_weight(N, 0.0) == pytest.approx(1 / N)


def test_zero_fill_is_biased_by_one_minus_p_n_minus_one_over_n() -> None:
    g = np.ones((N, 3))
    est = trial_estimates(g, P, TRIALS, estimator="zero_fill", seed=4)
    assert zero_fill_factor(N, P) == pytest.approx(0.9125)
    ok, z = within_3_se(est, np.full(3, zero_fill_factor(N, P)))
    assert ok, z
    ok, _ = within_3_se(est, np.ones(3))  # and clearly not the mean
    assert not ok


def test_reconstruct_formulas_and_refusals() -> None:
    own, others = torch.tensor([2.0]), torch.tensor([6.0])
    assert reconstruct(own, others, 2, 4, estimator="received_mean").item() == pytest.approx(8 / 3)
    assert reconstruct(own, others, 2, 4, estimator="zero_fill").item() == pytest.approx(2.0)
    assert reconstruct(own, others, 2, 4, estimator="inverse_probability", loss=0.5).item() == pytest.approx(3.5)
    with pytest.raises(ValueError, match="arrived"):
        reconstruct(own, others, 4, 4, estimator="received_mean")
    with pytest.raises(ValueError, match="unknown estimator"):
        reconstruct(own, others, 1, 4, estimator="median")
    with pytest.raises(ValueError, match="loss"):
        reconstruct(own, others, 1, 4, estimator="inverse_probability", loss=1.0)


# -- layout ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dim", "workers"), [(650, 8), (2410, 4), (9610, 8), (17, 17), (100_003, 6)])
def test_layout_covers_every_coordinate_once_in_datagram_sized_packets(dim: int, workers: int) -> None:
    layout = Layout.for_datagram(dim, workers, datagram_bytes(1500))
    covered = np.zeros(dim, dtype=int)
    for s in range(workers):
        start, stop = layout.shard_range(s)
        for p in range(layout.packets(s)):
            lo, hi = layout.packet_range(s, p)
            assert 0 < hi - lo <= layout.capacity
            covered[start + lo:start + hi] += 1
    assert (covered == 1).all()
    x = torch.arange(dim, dtype=torch.float32)
    s = workers - 1
    start, stop = layout.shard_range(s)
    datagrams = encode_packets(layout, x[start:stop], phase=Phase.GRADIENT, shard=s, iteration=3, sender=0)
    assert len(datagrams) == layout.packets(s)
    assert max(len(d) for d in datagrams) <= datagram_bytes(1500) == MTU_DATAGRAM
    assert HEADER_SIZE + 4 * layout.capacity <= MTU_DATAGRAM


def test_layout_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="dim >= workers"):
        Layout(3, 4, 10)
    with pytest.raises(ValueError, match="coordinates"):
        encode_packets(Layout(10, 2, 4), torch.zeros(4), phase=Phase.GRADIENT, shard=0, iteration=0, sender=0)


# -- inbox -----------------------------------------------------------------------------------------------
def packet(sender: int, phase: Phase, iteration: int, values: list[float], *, shard: int = 0, index: int = 0) -> Packet:
    return Packet(sender, phase, shard, iteration, index, np.asarray(values, dtype=np.float32))


def test_inbox_sums_what_arrived_and_counts_late_future_and_duplicate_packets() -> None:
    layout = Layout(8, 4, 2)  # shards of 2 coordinates, one packet each
    inbox = Inbox(layout, rank=0, resync=True, window=2)
    assert inbox.expected(Phase.GRADIENT) == 3 and inbox.expected(Phase.BROADCAST) == 3
    inbox.add(packet(1, Phase.GRADIENT, 0, [1, 2]))
    inbox.add(packet(2, Phase.GRADIENT, 0, [3, 4]))
    inbox.add(packet(2, Phase.GRADIENT, 0, [30, 40]))  # duplicate: ignored
    inbox.add(packet(3, Phase.GRADIENT, 1, [5, 6]))  # next iteration: buffered
    inbox.add(packet(3, Phase.GRADIENT, 3, [7, 8]))  # beyond the window (0 + 2): dropped
    slot = inbox.take(Phase.GRADIENT, 0)
    assert slot.received == 2 and not slot.complete
    assert slot.sums[(0, 0)].tolist() == [4.0, 6.0] and slot.counts[(0, 0)] == 2
    inbox.add(packet(3, Phase.GRADIENT, 0, [9, 9]))  # iteration 0 is closed: late
    inbox.advance(1)
    assert inbox.take(Phase.GRADIENT, 1).sums[(0, 0)].tolist() == [5.0, 6.0]
    assert dict(inbox.dropped) == {"malformed": 0, "foreign": 0, "not_mine": 0, "late": 1, "future": 1,
                                   "duplicate": 1}
    assert inbox.stored == 3


def test_inbox_wait_returns_when_complete_and_without_a_peer_after_max_wait() -> None:
    layout = Layout(6, 3, 2)

    async def main() -> tuple[int, int, bool]:
        inbox = Inbox(layout, rank=0, resync=True)
        loop = asyncio.get_running_loop()
        loop.call_soon(inbox.add, packet(1, Phase.GRADIENT, 0, [1, 1]))
        loop.call_soon(inbox.add, packet(2, Phase.GRADIENT, 0, [2, 2]))
        complete = await inbox.wait(Phase.GRADIENT, 0, 60.0, 60.0, 60.0)  # would hang a minute if incomplete
        nothing = await inbox.wait(Phase.BROADCAST, 0, 0.01, 0.01, 0.01)
        return complete.received, nothing.received, inbox.everyone_reached(Phase.GRADIENT, 0)

    assert asyncio.run(main()) == (2, 0, True)


def test_inbox_stops_waiting_for_a_peer_that_said_goodbye() -> None:
    layout = Layout(6, 3, 2)

    async def main() -> int:
        inbox = Inbox(layout, rank=0, resync=True)
        loop = asyncio.get_running_loop()
        loop.call_soon(inbox.add, packet(1, Phase.GRADIENT, 0, [1, 1]))
        loop.call_soon(inbox.peer_gone, 2)
        # every peer has then reached the phase: the short deadline applies, not the minute-long waits
        slot = await inbox.wait(Phase.GRADIENT, 0, 0.01, 60.0, 60.0)
        return slot.received

    assert asyncio.run(main()) == 1


# -- options and declarations ------------------------------------------------------------------------------
def test_options_validate_and_name_the_key() -> None:
    assert read_options(LossyOptions, {}, where="lossy_sgd options") == LossyOptions()
    for bad, key in (({"estimator": "median"}, "estimator"), ({"deadline_s": 0}, "deadline_s"),
                     ({"assumed_loss": 1.0}, "assumed_loss"), ({"mtu": 100}, "mtu"), ({"window": 0}, "window"),
                     ({"resync": "yes"}, "resync"), ({"spread_s": 0.001}, "spread_s"),
                     ({"max_wait_s": 0.001}, "max_wait_s"), ({"drift_every": 0}, "drift_every")):
        with pytest.raises(ValueError, match=f"option {key}="):
            read_options(LossyOptions, bad, where="lossy_sgd options")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['retransmit'\]; allowed: \['resync'"):
        read_options(LossyOptions, {"retransmit": True}, where="lossy_sgd options")


def test_both_declarations_run_the_one_job_and_differ_in_resync() -> None:
    resync, control = lookup(NAME), lookup(NORESYNC)
    assert resync.entry == control.entry == NAME
    assert resync.config["algorithm_args"]["resync"] is True
    assert control.config["algorithm_args"]["resync"] is False
    assert "udp" in resync.needs


def test_a_far_future_packet_is_no_evidence_that_its_sender_reached_the_phase() -> None:
    inbox = Inbox(Layout(8, 4, 2), rank=0, resync=True, window=2)
    inbox.add(packet(1, Phase.BROADCAST, 1 << 40, [1, 1], shard=1))
    assert inbox.dropped["future"] == 1 and not inbox.someone_reached(Phase.GRADIENT, 0)
    inbox.add(packet(1, Phase.GRADIENT, 0, [1, 1]))
    assert inbox.someone_reached(Phase.GRADIENT, 0) and not inbox.everyone_reached(Phase.GRADIENT, 0)
