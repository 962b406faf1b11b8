"""The five compression protocols through the catalog, in process: bytes on the wire per worker per step
equal their formulas (counted by the transport), every rank holds the same parameters, and each trains
logistic regression on digits."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from squall.bench.compressed import ALGORITHMS, CompressedBenchConfig, calls
from squall.collectives import run_inproc, sent_bytes
from squall.protocols.arc_topk.sgd import NAME as ARC
from squall.protocols.catalog import lookup, make_algorithm
from squall.protocols.lowbit.sgd import RING, TWO_STEP
from squall.protocols.randk.sgd import NAME as RANDK
from squall.protocols.topk.sgd import NAME as TOPK
from squall.training.compress import GroupQuant, RandK, TopK
from squall.training.loop import train
from squall.training.optim import LrSchedule, Sgd
from squall.training.run import LoopConfig
from squall.training.tasks import make_task
from squall.training.vote import TransportVote
from squall.transport import Transport, inproc_mesh

N = 4
ROWS, COLS = 64, 32
D = ROWS * COLS
HEADER = 48 + 16
STEPS = 3


def per_step_bytes(name: str, options: dict[str, Any]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Bytes each rank sent at each of ``STEPS`` steps from the same start, and the final parameters."""
    rng = np.random.default_rng(0)
    grads = [[torch.from_numpy(rng.standard_normal(D).astype(np.float32)) for _ in range(N)] for _ in range(STEPS)]

    async def one(transport: Transport) -> tuple[list[int], torch.Tensor]:
        algorithm = make_algorithm(name, transport, optimizer=Sgd(), options=dict(options))
        params, sent = torch.zeros(D), []
        for k in range(STEPS):
            before = transport.total_counters().bytes_sent
            params = await algorithm.step(k, params, grads[k][transport.rank], 0.1)
            sent.append(transport.total_counters().bytes_sent - before)
        return sent, params

    results = run_inproc(N, one)
    return [sent for sent, _ in results], [p for _, p in results]


def dense_ring(floats: int) -> int:
    return 2 * (N - 1) * 4 * floats // N + 2 * (N - 1) * HEADER


def test_top_k_sends_n_minus_1_payloads_of_8_bytes_per_kept_coordinate() -> None:
    sent, params = per_step_bytes(TOPK, {"ratio": 0.05, "ef": "ef14"})
    k = int(0.05 * D)
    assert sent == [[(N - 1) * (HEADER + TopK(k=k).wire_bytes(D))] * STEPS] * N
    assert TopK(k=k).wire_bytes(D) - 8 * k < 64  # the payload is 8k bytes and a small header
    assert all(torch.equal(params[0], p) for p in params)


def test_rand_k_is_one_index_free_ring_of_k_floats() -> None:
    sent, params = per_step_bytes(RANDK, {"ratio": 0.125})
    k = int(0.125 * D)
    assert sent == [[dense_ring(k)] * STEPS] * N
    assert dense_ring(k) < RandK(k=k).wire_bytes(D) * (N - 1)  # cheaper than gathering its payloads
    assert all(torch.equal(params[0], p) for p in params)


def test_arc_top_k_starts_dense_then_sends_two_rings_sketch_and_rows() -> None:
    sent, params = per_step_bytes(ARC, {"ratio": 0.125, "rank": 4, "cols": COLS})
    sketch, rows = ROWS * 4, int(0.125 * ROWS) * COLS
    assert sent == [[dense_ring(D)] + [dense_ring(sketch) + dense_ring(rows)] * (STEPS - 1)] * N  # EF21M starts dense
    assert all(torch.equal(params[0], p) for p in params)


@pytest.mark.parametrize("name", [TWO_STEP, RING])
@pytest.mark.parametrize("bits", [8, 4])
def test_low_bit_all_reduces_send_section_8_3_bytes(name: str, bits: int) -> None:
    sent, params = per_step_bytes(name, {"bits": bits, "group": 128})
    expected = sent_bytes(D, N, compression=GroupQuant(bits=bits), schedule="ring" if name == RING else "two_step")
    assert sent == [[expected] * STEPS] * N
    assert all(torch.equal(params[0], p) for p in params)


def test_options_are_checked_naming_the_key_value_and_what_is_allowed() -> None:
    transport = inproc_mesh(1)[0]
    with pytest.raises(ValueError, match=r"ratio = 2.0 must be in \[1/1024, 1\]"):
        make_algorithm(TOPK, transport, options={"ratio": 2.0})
    with pytest.raises(ValueError, match=r"ef = 'ef3' is not an error-feedback variant"):
        make_algorithm(ARC, transport, options={"ef": "ef3"})
    with pytest.raises(ValueError, match="bits must be one of"):
        make_algorithm(TWO_STEP, transport, options={"bits": 16})
    with pytest.raises(ValueError, match=r"algorithm 'randk': unknown option\(s\) \['rank'\]; allowed: \['ef'"):
        make_algorithm(RANDK, transport, options={"rank": 4})


TRAINING: dict[str, dict[str, Any]] = {
    TOPK: {"ratio": 0.05},
    RANDK: {"ratio": 0.25},
    ARC: {"ratio": 0.1, "cols": 10},
    TWO_STEP: {"bits": 4},
    RING: {"bits": 4},
}


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_each_protocol_trains_logistic_regression_to_85_percent_with_identical_ranks(name: str) -> None:
    options = {**lookup(name).config["algorithm_args"], **TRAINING[name]}  # the declaration's, scaled to 650 params
    task = make_task("logreg_digits")
    config = LoopConfig(lr=LrSchedule(0.5), steps=80, batch_size=32, eval_every=80)
    mesh = inproc_mesh(N)

    async def main() -> list[Any]:
        return await asyncio.gather(*(
            train(task, make_algorithm(name, t, optimizer=Sgd(), options=dict(options)), config,
                  rank=t.rank, world_size=N, traffic=t.total_counters, vote=TransportVote(t))
            for t in mesh))

    results = [r.summary() for r in asyncio.run(main())]
    assert len({r["param_hash"] for r in results}) == 1
    assert results[0]["final_eval"]["accuracy"] >= 0.85, results[0]["final_eval"]  # about 0.92 at 100 steps


def test_the_benchmark_job_runs_every_algorithm_and_each_sends_less_than_the_dense_ring() -> None:
    config = CompressedBenchConfig.from_json({"sizes": [64 << 10], "arc_cols": 64})
    numel = (64 << 10) // 4
    table = calls(config)
    assert set(table) == set(ALGORITHMS)
    rng = np.random.default_rng(5)
    inputs = [torch.from_numpy(rng.standard_normal(numel).astype(np.float32)) for _ in range(N)]
    sent = {}
    for name, call in table.items():

        async def one(transport: Transport, call: Any = call) -> int:
            await call(transport, inputs[transport.rank], 1)
            return transport.total_counters().bytes_sent

        sent[name] = max(run_inproc(N, one))
    assert sent["dense"] == dense_ring(numel)
    assert sent["dense16"] == dense_ring(numel // 2)  # the fp16 ring: half the bytes, the same messages
    assert all(sent[name] < sent["dense"] for name in ALGORITHMS if name != "dense"), sent
    assert sent["int4"] < sent["int8"] and sent["rand_k"] < sent["top_k"], sent
    with pytest.raises(ValueError, match=r"algorithms = \['zip'\] must be a non-empty subset"):
        CompressedBenchConfig.from_json({"algorithms": ["zip"]})
    with pytest.raises(ValueError, match=r"ratio = 0.0 must be in \[1/1024, 1\]"):
        CompressedBenchConfig.from_json({"ratio": 0.0})
