"""Gradient accumulation over micro-batches, with emulated compute time and an early stop.

DropCompute and Non-blocking SGD split a step's batch into ``count`` micro-batches and may stop
before the last one: DropCompute when the step's compute time passes a threshold, Non-blocking
SGD when the first worker finished its batch. :func:`accumulate` is that compute phase, shared::

    for index in range(count):
        if stop(elapsed since the step began): break     # checked before each micro-batch
        loss, g = task.loss_and_grad(x, next(batches))   # real compute (tiny model)
        sleep(device.microbatch_padding(...))            # emulated time of this micro-batch
        total += g

A micro-batch that is not started is not taken from ``batches``: the caller decides what
happens to it (:func:`drop` consumes it, as DropCompute's data loader does; Non-blocking SGD
leaves it for the next step). The gradient is the *sum* over completed micro-batches; the caller
normalises (by the nominal count or by an all-reduced count of completed ones).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from squall.training.device import DeviceModel
from squall.training.tasks.base import Batch, Task

StopFn = Callable[[float], bool]  # seconds since the step's compute began -> stop before the next micro-batch


@dataclass
class Accumulated:
    """What one step's compute phase produced."""

    grad: torch.Tensor  # sum of the completed micro-batches' gradients (zeros when none completed)
    loss_sum: float = 0.0  # sum of their losses
    done: int = 0  # micro-batches completed
    times_s: list[float] = field(default_factory=list)  # each completed micro-batch's duration (real + padding)
    compute_s: float = 0.0  # real compute, all micro-batches
    sleep_s: float = 0.0  # emulated padding, all micro-batches
    elapsed_s: float = 0.0  # the whole phase

    @property
    def mean_loss(self) -> float | None:
        """Mean loss of the completed micro-batches (None when none completed)."""
        return self.loss_sum / self.done if self.done else None


async def accumulate(
    task: Task,
    x: torch.Tensor,
    batches: Iterator[Batch],
    count: int,
    *,
    step: int,
    device: DeviceModel | None = None,
    stop: StopFn | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Accumulated:
    """Compute up to ``count`` micro-batches of ``step`` at ``x`` (see the module docstring)."""
    if count < 1:
        raise ValueError(f"need at least one micro-batch, got {count}")
    out = Accumulated(grad=torch.zeros_like(x))
    t0 = clock()
    for index in range(count):
        if stop is not None and stop(clock() - t0):
            break
        t = clock()
        loss, grad = task.loss_and_grad(x, next(batches))
        real = clock() - t
        pad = device.microbatch_padding(step, index, count, real) if device is not None else 0.0
        if pad > 0:
            await asyncio.sleep(pad)
        else:
            await asyncio.sleep(0)  # let a stop signal in
        took = clock() - t
        out.grad += grad
        out.loss_sum += loss
        out.done += 1
        out.times_s.append(took)
        out.compute_s += real
        out.sleep_s += max(0.0, took - real)
    out.elapsed_s = clock() - t0
    return out


def drop(batches: Iterator[Batch], count: int) -> None:
    """Take ``count`` micro-batches from ``batches`` without computing them (DropCompute's dropped data)."""
    for _ in range(count):
        next(batches)
