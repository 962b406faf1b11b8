"""The low-communication family's maths on the in-process transport (LOW-COMMUNICATION section 5, item 2).

Equivalences, to 1e-6: DiLoCo with H = 1, inner SGD and a plain outer SGD of lr 1 is data-parallel SGD;
Streaming DiLoCo with one fragment, no overlap, no quantization and alpha 0 is DiLoCo; alpha 1 never
takes the average (local training); SPARTA with p = 1 is per-step parameter averaging; DeMo keeping
every coefficient with beta 0 steps by sign(mean lr g); the chunked DCT inverts. And every replica
ends with the same global parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from squall.collectives import run_inproc
from squall.lowcomm.average import Averager
from squall.protocols.demo.dct import dct, idct, plan
from squall.protocols.demo.optimizer import DeMo
from squall.protocols.diloco.outer import DdpAdamW, DiLoCo
from squall.protocols.sparta.sparse import Sparta
from squall.protocols.streaming_diloco.outer import StreamingDiLoCo
from squall.training.algorithms.base import Algorithm, LocalOnly
from squall.training.algorithms.reduce import AllReduceSGD, LocalSGD
from squall.training.optim import AdamW, Sgd
from squall.training.tasks import TinyLM
from squall.transport import Transport

N, STEPS, LR = 3, 6, 0.05
TOL = 1e-6


@pytest.fixture(scope="module")
def task() -> TinyLM:
    return TinyLM(d_model=16, layers=2, heads=2, context=8, max_chars=30_000, eval_windows=8)


Build = Callable[[Transport], Algorithm]


def trajectory(task: TinyLM, build: Build, steps: int = STEPS, *, finish: bool = False) -> list[torch.Tensor]:
    """Every rank's parameters after ``steps`` steps on its own shard (real gradients of the task)."""

    async def one(transport: Transport) -> torch.Tensor:
        algorithm = build(transport)
        algorithm.bind_tensors(task.tensor_shapes)
        algorithm.bind_names(task.tensor_names)
        batches = task.batches(transport.rank, N, 0, 4)
        x = task.init_params(0)
        for k in range(steps):
            _, grad = task.loss_and_grad(x, next(batches))
            x = await algorithm.step(k, x, grad, LR)
        return await algorithm.finish(x) if finish else x

    return run_inproc(N, one)


def reducer(transport: Transport) -> Any:
    averager = Averager(transport)

    async def reduce(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await averager.mean(tensor, round)

    return reduce


def close(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_diloco_h1_sgd_inner_plain_outer_lr1_is_data_parallel_sgd(task: TinyLM) -> None:
    diloco = trajectory(task, lambda t: DiLoCo(Averager(t), sync_every=1, inner=Sgd(), outer_lr=1.0,
                                                outer_momentum=0.0))
    ddp = trajectory(task, lambda t: AllReduceSGD(reducer(t)))
    assert close(diloco, ddp) < TOL
    assert not torch.equal(ddp[0], task.init_params(0))


def test_streaming_one_fragment_no_overlap_unquantized_alpha0_is_diloco(task: TinyLM) -> None:
    def streaming(t: Transport) -> Algorithm:
        return StreamingDiLoCo(Averager(t), sync_every=2, fragments=1, overlap=0, alpha=0.0, inner=AdamW(),
                               outer_lr=0.7)

    ref = trajectory(task, lambda t: DiLoCo(Averager(t), sync_every=2, inner=AdamW()))
    got = trajectory(task, streaming)
    assert close(got, ref) < TOL
    assert all(torch.equal(got[0], x) for x in got[1:])  # H divides STEPS: just synced, identical


def test_streaming_alpha1_never_takes_the_average(task: TinyLM) -> None:
    got = trajectory(task, lambda t: StreamingDiLoCo(Averager(t), sync_every=2, fragments=2, overlap=0, alpha=1.0,
                                                     inner=AdamW()))
    alone = trajectory(task, lambda t: LocalOnly(optimizer=_AsSgd(AdamW())))
    assert close(got, alone) < TOL


def test_streaming_fragments_follow_the_staggered_schedule_and_end_global(task: TinyLM) -> None:
    seen: list[list[int]] = []

    def build(t: Transport) -> Algorithm:
        algorithm = StreamingDiLoCo(Averager(t), sync_every=4, fragments=2, overlap=1, inner=AdamW())
        if t.rank == 0:
            seen.append(algorithm.syncs)
        return algorithm

    final = trajectory(task, build, steps=8, finish=True)
    assert seen[0] == [3, 2]  # fragment 0 at 4 and 8, fragment 1 at 6, plus one each at the end
    assert all(torch.equal(final[0], x) for x in final[1:])


def test_sparta_p1_is_per_step_parameter_averaging(task: TinyLM) -> None:
    got = trajectory(task, lambda t: Sparta(Averager(t), inner=Sgd(), fraction=1.0))
    ref = trajectory(task, lambda t: LocalSGD(reducer(t), period=1, average_at_end=False))
    assert close(got, ref) < TOL


def test_sparta_averages_the_same_subset_on_every_replica(task: TinyLM) -> None:
    start = task.init_params(0)
    got = trajectory(task, lambda t: Sparta(Averager(t), inner=AdamW(), fraction=0.2, seed=3), steps=1)
    same = (got[0] == got[1]) & (got[1] == got[2])
    moved = got[0] != start
    share = float(same[moved].float().mean())
    expected = 1 - (1 - 1 / task.dim) ** round(0.2 * task.dim)  # drawn with replacement
    assert abs(share - expected) < 0.01, (share, expected)


def test_demo_keeping_everything_with_beta0_steps_by_the_sign_of_the_mean_gradient() -> None:
    shapes = ((12, 8), (8,), (5, 7))
    numel = sum(torch.Size(s).numel() for s in shapes)
    torch.manual_seed(0)
    grads = [torch.randn(numel) for _ in range(N)]
    x0 = torch.randn(numel)

    async def one(transport: Transport) -> torch.Tensor:
        demo = DeMo(transport, beta=0.0, k=4096, chunk=64)  # k >= every chunk: everything is kept
        demo.bind_tensors(shapes)
        return await demo.step(0, x0, grads[transport.rank], LR)

    out = run_inproc(N, one)
    mean = torch.stack(grads).mean(0) * LR
    clear = mean.abs() > 1e-5  # where the DCT's rounding cannot flip the sign
    assert torch.equal(out[0][clear], (x0 - LR * mean.sign())[clear])
    assert all(torch.equal(out[0], x) for x in out[1:])


@pytest.mark.parametrize("shape", [(64, 64), (97, 128), (12, 10), (4096,), (97,), (3, 4, 5)])
def test_idct_of_dct_is_the_identity(shape: tuple[int, ...]) -> None:
    p = plan(shape, chunk=64, k=32)
    x = torch.randn(p.numel)
    assert float((idct(dct(x, p), p) - x).abs().max()) < 1e-5
    assert p.tiles * p.tile == p.numel


def test_ddp_adamw_keeps_every_replica_identical(task: TinyLM) -> None:
    got = trajectory(task, lambda t: DdpAdamW(Averager(t), inner=AdamW()))
    assert all(torch.equal(got[0], x) for x in got[1:])


class _AsSgd(Sgd):
    """An AdamW where LocalOnly expects its optimiser (only ``update`` is used)."""

    def __init__(self, inner: AdamW) -> None:
        super().__init__()
        self.inner = inner

    def update(self, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        return self.inner.update(params, grad, lr)
