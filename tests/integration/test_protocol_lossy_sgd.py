"""lossy_sgd on 8 real containers: packets dropped by netem (lossy-10pct: 5 ms, 10 % random loss per link),
never by the protocol.

* lossy_sgd reaches the accuracy target with every worker, its drift from the owners stays bounded
  (late/mid <= 2), and the loss measured from datagram counters (sent vs received on every directed link)
  is within a binomial bound of the configured 10 %.
* The no-resync control under the same loss drifts: its late drift is many times lossy_sgd's and grows
  from the first quarter of the run.
* The same digits MLP trained without loss (wan-5ms) ends within a few points of the lossy run's accuracy.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from squall.checks import Target, converged
from squall.checks.drift import EARLY, drift_growth, owner_drift_bounded, owner_drift_series
from squall.experiment.lab import Lab, RunSpec
from squall.protocols.catalog import lookup
from squall.protocols.lossy_sgd.protocol import NAME, NORESYNC
from squall.run_trace import RunTrace

pytestmark = pytest.mark.docker
logger = logging.getLogger(__name__)

WORKERS = 8
LOSSY, LOSSLESS = "lossy-10pct", "wan-5ms"
CONFIGURED_LOSS = 0.10
STEPS = 400
TASK_ARGS = {"hidden": 32}  # 64 -> 32 -> 10: 2 410 parameters, one datagram per shard and phase
BASE = {"task_args": TASK_ARGS, "eval_every": 100, "timeout": 30}
ACCURACY = 0.85  # digits MLP after 400 steps of 8 x 32 samples at lr 0.2: about 0.9-0.95
MAX_GROWTH = 2.0  # T7.2: late drift <= 2 x mid-run drift
NORESYNC_OVER_RESYNC = 10.0  # the control's late drift over lossy_sgd's (measured 1 500-4 600x)
ACCURACY_GAP = 0.05  # lossy vs lossless final accuracy (T7.3 asks 1 % on longer runs; a short run is noisier)


def spec(protocol: str, profile: str, **args: Any) -> RunSpec:
    algorithm_args = {**lookup(protocol).config["algorithm_args"], "drift_every": 5, **args}
    return RunSpec(protocol, profile, seed=1, task="mlp_digits", steps=STEPS, seconds=None, lr=0.2,
                   config={**BASE, "algorithm_args": algorithm_args})


@pytest.fixture(scope="module")
def traces(docker_client: Any, worker_image: str) -> Iterator[Mapping[str, tuple[RunTrace, float]]]:
    out: dict[str, tuple[RunTrace, float]] = {}
    with Lab(workers=WORKERS) as lab:
        for key, cell in (("lossy", spec(NAME, LOSSY)), ("noresync", spec(NORESYNC, LOSSY)),
                          ("lossless", spec(NAME, LOSSLESS))):
            start = time.monotonic()
            trace = lab.run(cell)
            out[key] = (trace, time.monotonic() - start)
            logger.info("%s: %.1f s", key, out[key][1])
    yield out


def final_accuracy(trace: RunTrace) -> float:
    return statistics.fmean(s["final_eval"]["accuracy"] for s in trace.meta.summaries)


def measured_loss(trace: RunTrace) -> tuple[float, int]:
    """1 - received / sent over every directed link, from the end records' datagram counters."""
    summaries = {s["rank"]: s for s in trace.meta.summaries}
    sent = sum(summaries[i]["sent_to"][j] for i in summaries for j in summaries if i != j)
    received = sum(summaries[j]["received_from"][i] for i in summaries for j in summaries if i != j)
    return 1 - received / sent, sent


def test_lossy_sgd_trains_with_bounded_drift_on_real_loss(traces: Mapping[str, tuple[RunTrace, float]]) -> None:
    trace, seconds = traces["lossy"]
    assert not trace.meta.failures, trace.meta.failures
    verdict = converged(trace, Target("accuracy", ACCURACY))
    assert verdict.passed, verdict.line()
    drift = owner_drift_bounded(trace, max_growth=MAX_GROWTH)
    assert drift.passed, drift.line()
    summaries = trace.meta.summaries
    assert all(s["steps"] == STEPS for s in summaries)
    for reason in ("malformed", "foreign", "not_mine", "future", "duplicate"):
        counts = [s[f"dropped_{reason}"] for s in summaries]
        assert not any(counts), (reason, counts)
    loss, sent = measured_loss(trace)
    sigma = math.sqrt(CONFIGURED_LOSS * (1 - CONFIGURED_LOSS) / sent)
    assert abs(loss - CONFIGURED_LOSS) <= 4 * sigma + 0.005, f"measured {loss:.4f} over {sent} datagrams"
    missed = statistics.fmean(s["missed_fraction"] for s in summaries)
    assert CONFIGURED_LOSS - 0.03 <= missed <= CONFIGURED_LOSS + 0.05, f"{missed:.4f} of the packets missed"
    logger.info("lossy: %.1f s, measured loss %.4f over %d datagrams, missed %.4f, %s", seconds, loss, sent, missed,
                drift.line())


def test_noresync_control_drifts(traces: Mapping[str, tuple[RunTrace, float]]) -> None:
    lossy, _ = traces["lossy"]
    trace, seconds = traces["noresync"]
    assert not trace.meta.failures, trace.meta.failures
    control = drift_growth(owner_drift_series(trace), mid=EARLY)  # from the first quarter (see EARLY)
    resync = drift_growth(owner_drift_series(lossy))
    assert control is not None and resync is not None
    assert control[1] >= NORESYNC_OVER_RESYNC * resync[1], (control, resync)
    assert control[2] > 1.2, f"the control's drift does not grow: {control}"
    logger.info("noresync: %.1f s, drift early %.3g late %.3g growth %.2f (lossy_sgd mid %.3g late %.3g %.2f)", seconds,
                *control, *resync)


def test_lossy_accuracy_close_to_lossless(traces: Mapping[str, tuple[RunTrace, float]]) -> None:
    lossy, lossless = final_accuracy(traces["lossy"][0]), final_accuracy(traces["lossless"][0])
    assert abs(lossy - lossless) <= ACCURACY_GAP, (lossy, lossless)
    summaries = traces["lossless"][0].meta.summaries
    assert all(s["missed_fraction"] <= 0.01 for s in summaries), [s["missed_fraction"] for s in summaries]
    logger.info("accuracy lossy %.4f, lossless %.4f", lossy, lossless)
