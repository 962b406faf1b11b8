"""Streaming DiLoCo's inner steps and staggered, overlapped fragment syncs (see the package docstring)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import torch

from squall.lowcomm.average import Averager
from squall.protocols.streaming_diloco.fragments import Ranges, by_blocks, check_schedule, contiguous, syncing
from squall.training.algorithms.base import Algorithm, Shapes
from squall.training.optim import LocalOptimizer, Sgd, SgdConfig

OUTER_LR = 0.4  # the paper's, tuned small and fixed across scales
OUTER_MOMENTUM = 0.9  # not stated by the paper: DiLoCo's
ALPHA = 0.5  # the paper's merge of local and global parameters


def gather(x: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """The fragment's values, concatenated in range order."""
    return torch.cat([x[a:b] for a, b in ranges]) if len(ranges) != 1 else x[ranges[0][0]:ranges[0][1]].clone()


def scatter(x: torch.Tensor, ranges: Ranges, values: torch.Tensor) -> None:
    """Write ``values`` (as :func:`gather` laid them out) back into ``x`` in place."""
    offset = 0
    for a, b in ranges:
        x[a:b] = values[offset:offset + b - a]
        offset += b - a


@dataclass
class _InFlight:
    fragment: int  # which fragment
    due: int  # inner steps done when the average is awaited
    task: asyncio.Task[torch.Tensor]  # the average of its outer gradient


class StreamingDiLoCo(Algorithm):
    """Fragments synchronised one after another, each every ``H`` steps, ``tau`` steps of overlap.

    :param averager: the averaging seam (FP4 compression by default).
    :param sync_every: ``H``; a multiple of ``fragments``.
    :param fragments: ``F``.
    :param overlap: ``tau`` inner steps between sending a fragment and merging its average, ``0 <= tau < H/F``.
    :param alpha: the merge: ``theta_i <- alpha theta_i + (1 - alpha) theta~`` (0: take the global).
    :param pattern: ``strided`` or ``sequential`` assignment of blocks to fragments.
    :param sync_at_end: in :meth:`finish`, one last outer step of every fragment.
    """

    name = "streaming_diloco"

    def __init__(self, averager: Averager, *, sync_every: int, fragments: int, inner: LocalOptimizer,
                 overlap: int = 1, alpha: float = ALPHA, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, nesterov: bool = True, pattern: str = "strided",
                 sync_at_end: bool = True) -> None:
        super().__init__()
        check_schedule(sync_every, fragments, overlap)
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if not outer_lr > 0:
            raise ValueError(f"outer_lr must be > 0, got {outer_lr}")
        self.averager, self.inner = averager, inner
        self.sync_every, self.fragments, self.overlap, self.alpha = sync_every, fragments, overlap, alpha
        self.outer_lr, self.pattern, self.sync_at_end = outer_lr, pattern, sync_at_end
        self.outer = [Sgd(SgdConfig(momentum=outer_momentum, nesterov=nesterov and outer_momentum > 0))
                      for _ in range(fragments)]
        self.ranges: tuple[Ranges, ...] | None = None
        self._shapes: Shapes | None = None
        self.theta: torch.Tensor | None = None  # the global parameters (each fragment as of its last sync)
        self.pending: _InFlight | None = None
        self.syncs = [0] * fragments
        self.peak_bytes = 0  # exact bytes of the largest fragment average sent so far
        self._done = 0

    # -- fragments -------------------------------------------------------------------------------
    def bind_tensors(self, shapes: Shapes) -> None:
        self._shapes = shapes

    def bind_names(self, names: tuple[str, ...]) -> None:
        if self._shapes is not None:
            self.ranges = by_blocks(names, self._shapes, self.fragments, self.pattern)

    def _setup(self, params: torch.Tensor) -> None:
        self.theta = params.detach().clone()
        self.averager.bind_model(params.numel())
        if self.ranges is None:
            self.ranges = contiguous(params.numel(), self.fragments)

    def fragment_numel(self, p: int) -> int:
        """Parameters in fragment ``p``."""
        assert self.ranges is not None
        return sum(b - a for a, b in self.ranges[p])

    # -- steps -----------------------------------------------------------------------------------
    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self.theta is None:
            self._setup(params)
        local = self.inner.update(params, grad, lr)
        self._done = k + 1
        if self.pending is not None and self.pending.due <= self._done:
            await self._merge(local)
        p = syncing(self._done, self.sync_every, self.fragments)
        if p is not None:
            self._send(local, p, round=k)
            if self.overlap == 0:
                await self._merge(local)
        return local

    def _send(self, local: torch.Tensor, p: int, *, round: int) -> None:
        assert self.theta is not None and self.ranges is not None and self.pending is None
        delta = gather(self.theta, self.ranges[p]) - gather(local, self.ranges[p])
        task = asyncio.ensure_future(self.averager.mean(delta, round))
        self.pending = _InFlight(p, self._done + self.overlap, task)
        self.peak_bytes = max(self.peak_bytes, self.averager.bytes_sent(delta.numel()))

    async def _merge(self, local: torch.Tensor) -> None:
        """Await the fragment in flight; outer step; merge it into ``local`` in place."""
        assert self.pending is not None and self.theta is not None and self.ranges is not None
        flight, self.pending = self.pending, None
        p, ranges = flight.fragment, self.ranges[flight.fragment]
        delta = await flight.task
        updated = self.outer[p].update(gather(self.theta, ranges), delta, self.outer_lr)
        scatter(self.theta, ranges, updated)
        mixed = updated if self.alpha == 0 else self.alpha * gather(local, ranges) + (1 - self.alpha) * updated
        scatter(local, ranges, mixed)
        self.syncs[p] += 1

    async def finish(self, params: torch.Tensor) -> torch.Tensor:
        if self.theta is None:
            return params
        local = params.clone()
        if self.pending is not None:
            await self._merge(local)
        if not self.sync_at_end:
            return local
        for p in range(self.fragments):  # one last outer step each, then the global parameters
            self._send(local, p, round=self._done + p)
            await self._merge(local)
        assert self.theta is not None
        return self.theta.clone()

    def stats(self) -> dict[str, Any]:
        if self.ranges is None:
            return {"fragments": self.fragments, "sync_every": self.sync_every}
        sizes = [self.fragment_numel(p) for p in range(self.fragments)]
        return {"fragments": self.fragments, "sync_every": self.sync_every, "outer_steps": sum(self.syncs),
                "avg_every": self.sync_every // self.fragments, "overlap_steps": self.overlap,
                "peak_avg_bytes": self.peak_bytes, **self.averager.figures(round(sum(sizes) / len(sizes)))}
