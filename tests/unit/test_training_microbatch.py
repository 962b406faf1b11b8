"""The shared micro-batch compute phase: accumulation, emulated time, the early stop, what is left."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from squall.training.device import DeviceModel
from squall.training.microbatch import accumulate, drop
from squall.training.tasks import make_task


@pytest.fixture
def task():
    return make_task("logreg_digits")


def _run(coro):
    return asyncio.run(coro)


def test_sums_every_micro_batch_when_nothing_stops_it(task) -> None:
    x = task.init_params(0)
    batches = task.batches(0, 2, 0, 8)
    ref_batches = task.batches(0, 2, 0, 8)
    out = _run(accumulate(task, x, batches, 4, step=0))
    want = sum(task.loss_and_grad(x, next(ref_batches))[1] for _ in range(4))
    assert out.done == 4 and len(out.times_s) == 4
    assert torch.allclose(out.grad, want)
    # nothing beyond the four was taken: both streams go on with the same batch
    assert torch.equal(next(batches)[0], next(ref_batches)[0])


def test_stops_before_the_next_micro_batch_and_leaves_it(task) -> None:
    x = task.init_params(0)
    device = DeviceModel(step_time_s=0.008)  # 4 micro-batches of at least 2 ms each
    seen: list[float] = []

    def stop(elapsed: float) -> bool:  # DropCompute asks with the elapsed time; stop after three
        seen.append(elapsed)
        return len(seen) > 3

    batches = task.batches(0, 2, 0, 8)
    out = _run(accumulate(task, x, batches, 4, step=0, device=device, stop=stop))
    assert out.done == 3 and len(seen) == 4
    assert seen == sorted(seen) and seen[3] >= 3 * 0.002  # asked before each, with the time so far
    assert all(t >= 0.002 for t in out.times_s) and out.sleep_s > 0
    left = task.batches(0, 2, 0, 8)
    for _ in range(3):
        next(left)
    assert torch.equal(next(batches)[0], next(left)[0])  # the 4th was not consumed


def test_drop_consumes_without_computing(task) -> None:
    a, b = task.batches(0, 2, 0, 8), task.batches(0, 2, 0, 8)
    drop(a, 3)
    for _ in range(3):
        next(b)
    assert torch.equal(next(a)[0], next(b)[0])


def test_the_device_model_times_each_micro_batch() -> None:
    device = DeviceModel(step_time_s=0.16, straggler_probability=1.0, straggler_factor=4.0)
    assert device.microbatch_time(3, 0, 8, 0.001) == pytest.approx(0.08)  # 20 ms x 4
    assert DeviceModel(slowdown=2.0).microbatch_time(0, 1, 2, 0.01) == pytest.approx(0.02)
    with pytest.raises(ValueError, match="micro-batch 8 of 8"):
        device.microbatch_time(0, 8, 8, 0.0)


def test_zero_micro_batches_is_refused(task) -> None:
    with pytest.raises(ValueError, match="at least one"):
        _run(accumulate(task, task.init_params(0), itertools.repeat(None), 0, step=0))  # type: ignore[arg-type]
