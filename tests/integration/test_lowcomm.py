"""The low-communication family on 4 real containers under a shaped profile (thin-100mbit: 100 Mbit/s,
5 ms one-way), a small tinylm and an emulated device: every protocol trains, the replicas that should hold the
same global model do, the bytes each worker's transport counted equal the protocol's exact formula, and the
emulated device and payload are in every result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from squall.experiment.lab import Lab, RunSpec
from squall.run_trace import RunTrace

pytestmark = pytest.mark.docker

WORKERS = 4
PROFILE = "thin-100mbit"
STEPS = 12
STEP_TIME_S = 0.05
TASK_ARGS = {"d_model": 32, "layers": 2, "heads": 2, "context": 16, "eval_windows": 16}
#: protocol -> (its options over the declaration's, whether every replica ends with the same parameters)
CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "ddp_adamw": ({}, True),
    "diloco": ({"sync_every": 4}, True),
    "streaming_diloco": ({"sync_every": 4, "fragments": 2, "overlap": 1}, True),
    "sparta": ({"fraction": 0.05}, False),
    "demo": ({"k": 8, "chunk": 16}, True),
}


@pytest.fixture(scope="module")
def lab(docker_client: Any, worker_image: str) -> Iterator[Lab]:
    """Name: lab. Scope: module. Depends: docker_client, worker_image. 4 workers, shaped by the lab."""
    with Lab(workers=WORKERS) as lab:
        yield lab


def run(lab: Lab, protocol: str, args: dict[str, Any], **config: Any) -> RunTrace:
    from squall.protocols.catalog import lookup

    algorithm_args = {**lookup(protocol).config.get("algorithm_args", {}), **args}
    spec = RunSpec(protocol, PROFILE, task="tinylm", steps=STEPS, seconds=None, lr=0.003, batch_size=8,
                   config={"task_args": TASK_ARGS, "eval_every": STEPS, "algorithm_args": algorithm_args,
                           "device": {"step_time_s": STEP_TIME_S}, **config})
    trace = lab.run(spec)
    assert not trace.meta.failures, trace.meta.failures
    return trace


def loop_bytes(trace: RunTrace, worker: int) -> int:
    """Bytes the worker's transport counted from the first step record (after the start barrier) to the end."""
    first = min((r for r in trace.of(worker)), key=lambda r: r.step)
    assert first.step == 0
    return int(trace.meta.summaries[worker]["bytes_sent"]) - first.bytes_sent


@pytest.mark.parametrize("protocol", list(CASES))
def test_protocol_trains_in_containers_and_sends_exactly_its_formula(lab: Lab, protocol: str) -> None:
    args, same = CASES[protocol]
    trace = run(lab, protocol, args)
    summaries = trace.meta.summaries
    hashes = {s["param_hash"] for s in summaries}
    assert (len(hashes) == 1) == same, hashes
    for worker, s in enumerate(summaries):
        assert s["steps"] == STEPS
        first = next(r for r in trace.of(worker) if r.step == 0)
        assert first.eval_loss is not None and s["final_eval"]["loss"] < first.eval_loss, (first.eval_loss, s)
        assert loop_bytes(trace, worker) == s["avg_bytes_total"] > 0, (worker, s)
        device = s["device"]
        assert device["step_time_s"] == STEP_TIME_S
        assert device["emulated_compute_s"] == pytest.approx(STEPS * STEP_TIME_S)
        assert device["valid"] == (device["overrun_s"] <= 0.01 * device["steps_s"])
        assert 0 < device["utilization"] <= 1


def test_an_emulated_payload_pads_the_synchronised_state(lab: Lab) -> None:
    payload = {"params": "1M", "dtype": "bf16"}
    trace = run(lab, "diloco", {"sync_every": 4}, payload=payload)
    for worker, s in enumerate(trace.meta.summaries):
        assert s["payload"]["params"] == 1_000_000 and s["payload"]["bytes"] == 2_000_000
        assert s["avg_wire_bytes"] == 2_000_000  # the whole (padded) model per outer step, in bf16
        assert loop_bytes(trace, worker) == s["avg_bytes_total"] > 3 * 2 * (WORKERS - 1) / WORKERS * 2_000_000
