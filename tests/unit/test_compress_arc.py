"""ARC-Top-K (docs/protocols/compression.md, T6.1, T6.2): identical rows on every worker, contraction of the aggregate,
bytes per step against the formulas, the paper's reshaping, and the heterogeneous synthetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from squall.collectives import allreduce, run_inproc
from squall.protocols.arc_topk.sgd import ArcConfig, arc_bytes_per_rank
from squall.protocols.arc_topk.synthetic import Shifted, contraction_trials, shifted_distance
from squall.protocols.catalog import make_algorithm
from squall.protocols.topk.sgd import TopKConfig
from squall.training.compress import Compression, TopK, arc
from squall.training.loop import LoopConfig
from squall.training.optim import LrSchedule
from squall.training.tasks import make_task
from squall.transport import Transport
from tests.unit.test_training_loop import run_ranks

WORKERS = 8
ROWS, COLS, RANK = 64, 16, 4
RATIO = 0.125  # 8 of 64 rows: every all-reduced size is a multiple of 8 workers
HEADER = 48 + 16  # message header and 1-d tensor descriptor


def gradients(seed: int, workers: int = WORKERS) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    common = rng.standard_normal((ROWS, COLS)) * np.exp(rng.standard_normal((ROWS, 1)))
    return [torch.from_numpy((common + rng.standard_normal((ROWS, COLS))).astype(np.float32).reshape(-1))
            for _ in range(workers)]


def test_t6_1_every_worker_selects_the_same_rows_and_returns_the_same_mean() -> None:
    grads = gradients(1)
    config = ArcConfig(ratio=RATIO, rank=RANK, cols=COLS, seed=5)

    compression = config.compression(ROWS * COLS)

    async def one(transport: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        local = torch.empty(ROWS * COLS)
        mean = await allreduce(transport, grads[transport.rank], round=3, op="mean", compression=compression,
                               local=local)
        return local, mean

    results = run_inproc(WORKERS, one)
    rows = [tuple(np.flatnonzero(local.view(ROWS, COLS).abs().sum(dim=1).numpy())) for local, _ in results]
    assert len(set(rows)) == 1 and len(rows[0]) == 8, rows  # identical indices, k = 8 rows, none sent
    assert all(torch.equal(results[0][1], mean) for _, mean in results)  # bit-identical aggregate
    exact = torch.stack(grads).double().mean(dim=0).view(ROWS, COLS)
    picked = [int(r) for r in rows[0]]
    np.testing.assert_allclose(results[0][1].view(ROWS, COLS)[picked].numpy(), exact[picked].numpy(), atol=1e-5)
    assert float(results[0][1].view(ROWS, COLS)[[r for r in range(ROWS) if r not in picked]].abs().max()) == 0.0


def test_t6_1_exact_sketch_contracts_and_rank_4_stays_within_slack_in_95_percent_of_1000_trials() -> None:
    for spread in (0.0, 1.0):  # rows alike (selection near random) and rows of very different sizes
        trials = contraction_trials(trials=1000, workers=WORKERS, rows=ROWS, cols=COLS, ratio=RATIO, rank=RANK,
                                    slack=1.1, spread=spread, seed=2)
        assert trials.exact_max <= 1.0 + 1e-9, trials  # ||C(G) - G||^2 <= (1 - k/n) ||G||^2, every trial
        assert trials.sketch_within >= 0.95, trials


def test_t6_1_bytes_per_worker_per_step_equal_the_formulas() -> None:
    grads = gradients(2)
    n, d = WORKERS, ROWS * COLS
    k = int(RATIO * ROWS)

    def measured(compression: Compression | None) -> list[int]:
        async def one(transport: Transport) -> int:
            before = transport.total_counters()
            await allreduce(transport, grads[transport.rank], round=0, op="mean", compression=compression)
            after = transport.total_counters()
            return after.bytes_sent - before.bytes_sent

        return run_inproc(n, one)

    arc_sent = measured(ArcConfig(ratio=RATIO, rank=RANK, cols=COLS).compression(d))
    arc_formula = 2 * (n - 1) * 4 * (ROWS * RANK + k * COLS) // n
    assert arc_formula == arc_bytes_per_rank(d, n, ArcConfig(ratio=RATIO, rank=RANK, cols=COLS))
    assert arc_sent == [arc_formula + 2 * 2 * (n - 1) * HEADER] * n  # two rings of 2(n-1) messages

    topk_sent = measured(TopKConfig(ratio=k * COLS / d).compressor())
    payload_header = TopK(k=1).wire_bytes(d) - 8
    assert topk_sent == [(n - 1) * 8 * k * COLS + (n - 1) * (payload_header + HEADER)] * n

    assert measured(None) == [2 * (n - 1) * 4 * ROWS * COLS // n + 2 * (n - 1) * HEADER] * n
    assert arc_formula < (n - 1) * 8 * k * COLS  # at 8 workers the sketch pays for itself against all-gather


def test_the_paper_reshaping_of_1d_2d_and_higher_tensors() -> None:
    assert arc.matrix_shape((100,)) is None
    assert arc.matrix_shape((30, 7)) == (30, 7)
    assert arc.matrix_shape((16, 8, 3, 3)) == (64, 18)  # conv weight: (d / 2t^2, 2t^2)
    assert arc.matrix_shape((2, 3, 3, 4)) == (18, 4)  # 2t^2 = 32 does not divide 72: (d / t, t)
    segments = arc.plan(700 + 30 + 16 * 8 * 9, shapes=[(70, 10), (30,), (16, 8, 3, 3)])
    assert [(s.rows, s.cols) for s in segments] == [(70, 10), (30, 0), (64, 18)]
    assert arc.sketch_numel(segments, 4) == 70 * 4 + 30 + 64 * 4  # the 1-d tensor is all-reduced whole
    assert arc.selected_numel(segments, 0.1) == 7 * 10 + 3 + 6 * 18
    x = np.arange(1, segments[-1].offset + segments[-1].numel + 1, dtype=np.float32)
    everything = [np.arange(s.rows) for s in segments]
    np.testing.assert_array_equal(arc.scatter_rows(arc.gather_rows(x, segments, everything), segments, everything,
                                                   x.size), x)
    flat = arc.plan(1000, cols=64)  # a flat gradient: one matrix, the last row padded
    assert [(s.rows, s.cols) for s in flat] == [(16, 64)]
    with pytest.raises(ValueError, match="shapes hold 12 elements, the vector has 13"):
        arc.plan(13, shapes=[(3, 4)])


def test_arc_settings_are_checked_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"ratio = 0.0 must be in \(0, 1\]"):
        ArcConfig(ratio=0.0)
    with pytest.raises(ValueError, match=r"rank = 0 must be in \[1, 1024\]"):
        ArcConfig(rank=0)


@pytest.mark.parametrize("ratio", [0.01, 0.05])
def test_t6_2_arc_beats_local_top_k_tenfold_and_stays_within_10x_of_uncompressed(ratio: float) -> None:
    problem = Shifted()
    distances = {v: shifted_distance(v, ratio, problem=problem, seed=0)
                 for v in ("uncompressed", "local_topk", "arc_topk")}
    assert distances["arc_topk"] <= 0.1 * distances["local_topk"], distances
    assert distances["arc_topk"] <= 10 * distances["uncompressed"], distances
    # local Top-K's error floor (docs/protocols/compression.md: 0.059-0.140)
    assert distances["local_topk"] > 0.05, distances


@pytest.mark.parametrize("reshape", ["task", "flat"])
def test_the_shared_loop_tells_arc_the_tasks_tensors_and_the_wire_carries_the_per_tensor_formula(reshape: str) -> None:
    """``reshape: task`` (the default): logistic regression's ``w`` (10 x 64) is sketched as a matrix and its
    bias ``b`` (10,) all-reduced whole; ``flat``: the 650 floats as one matrix of ``cols`` columns."""
    task = make_task("logreg_digits")
    assert task.tensor_shapes == ((10, 64), (10,))
    n, steps, options = 4, 6, {"ratio": 0.2, "rank": 4, "cols": 10, "reshape": reshape, "dense_start": False}
    config = LoopConfig(lr=LrSchedule(0.3), steps=steps, eval_every=steps)
    results, _ = run_ranks(task, lambda t: make_algorithm("arc_topk", t, options=dict(options)), config, world=n,
                           vote=False)
    assert len({r.fingerprint.hash for r in results}) == 1  # every rank applied the same aggregate
    arc_config = ArcConfig(ratio=0.2, rank=4, cols=10, reshape=reshape)
    segments = arc.plan(task.dim, shapes=arc_config.tensors(task.tensor_shapes), cols=10)
    if reshape == "task":
        assert [(s.rows, s.cols) for s in segments] == [(10, 64), (10, 0)]
        floats = (10 * 4 + 10) + (2 * 64 + 2)  # sketch: w's rows x rank, b whole; selected: 2 rows of w, 2 of b
    else:
        assert [(s.rows, s.cols) for s in segments] == [(65, 10)]
        floats = 65 * 4 + 13 * 10
    assert arc.sketch_numel(segments, 4) + arc.selected_numel(segments, 0.2) == floats
    data = arc_bytes_per_rank(task.dim, n, arc_config, task.tensor_shapes)
    assert data == 2 * (n - 1) * 4 * floats // n
    headers = 2 * 2 * (n - 1) * HEADER  # two rings of 2(n-1) messages a step
    slack = 2 * 2 * (n - 1) * 4  # segments of sizes n does not divide: a float more or less per message
    for result in results:
        per_step = result.traffic["bytes_sent"] / steps
        assert abs(per_step - (data + headers)) <= slack, (result.traffic, data + headers)


def test_an_unknown_reshape_is_refused_naming_the_key_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"reshape = 'rows' must be one of task, flat"):
        ArcConfig(reshape="rows")
