"""The synchronisation after the compute phase, given each worker's gradient sum over its ``done`` micro-batches.

* :class:`RingSync` (centralised Non-blocking SGD): ring all-reduce of ``[sum of gradients, done]``,
  then ``x <- x - lr * (global sum / global done)``: the mean gradient over every micro-batch
  finished anywhere, each micro-batch weighted alike, so a slow worker's few micro-batches count
  for what they are. Every rank gets bit-identical parameters.
* :class:`GossipSync` (decentralised, D-PSGD or MATCHA): each worker steps with its *own* mean
  gradient ``sum / done`` (nothing when ``done`` is 0), then mixes parameters with its neighbours:
  exactly :class:`~squall.gossip.sgd.GossipSGD`'s step with the given mixer. The weighting is
  per worker, not per micro-batch: scaling a worker's step by ``done / b`` would let the fast
  workers' shards pull the consensus towards their data (the mixing matrix, not the compute
  speed, sets how much each worker's model counts), and a gradient mean over fewer samples is
  still unbiased, only noisier.

The gossip mixer is built by reference (``package.module:function``, called as
``function(transport, **mixer_args)``), so a user can synchronise with a mixer of their own: the
shipped ones, D-PSGD's graph mixer and MATCHA's matchings mixer, both live in the shared gossip
layer (:mod:`squall.gossip.sgd`, :mod:`squall.gossip.matchings`); a reference names a mixer
the way a job entry point is named, and a missing one fails when the job starts, with the
reference in the message.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import torch

from squall.collectives import ring_allreduce
from squall.gossip.sgd import GossipSGD
from squall.job import resolve_callable
from squall.training.algorithms.base import Mixer
from squall.training.optim import Sgd
from squall.transport import Transport

SYNC_TAG = 0x4E425359  # "NBSY": the ring all-reduce of [gradient sum, count]

#: ``(transport, **mixer_args) -> Mixer``
MixerFactory = Callable[..., Mixer]


class Sync(ABC):
    """One synchronisation of iteration ``k`` (see the module docstring)."""

    @abstractmethod
    async def step(self, k: int, x: torch.Tensor, grad_sum: torch.Tensor, done: int, lr: float) -> tuple[
            torch.Tensor, int]:
        """New parameters, and the micro-batches their update used (all ranks' for the ring, own for gossip)."""


class RingSync(Sync):
    """Count-weighted ring all-reduce of the gradient sums (see the module docstring)."""

    def __init__(self, transport: Transport, optimizer: Sgd | None = None, *, timeout: float | None = None) -> None:
        self.transport, self.optimizer, self.timeout = transport, optimizer or Sgd(), timeout

    async def step(self, k: int, x: torch.Tensor, grad_sum: torch.Tensor, done: int, lr: float) -> tuple[
            torch.Tensor, int]:
        packed = torch.cat([grad_sum.reshape(-1), grad_sum.new_tensor([float(done)])])
        if self.transport.world_size > 1:
            packed = await ring_allreduce(self.transport, packed, round=k, tag=SYNC_TAG, timeout=self.timeout)
        total = round(float(packed[-1]))
        if total < 1:
            raise RuntimeError(f"iteration {k}: no rank finished a micro-batch (all-reduced count {total})")
        grad = (packed[:-1] / total).reshape(grad_sum.shape)
        return self.optimizer.update(x, grad, lr), total


class GossipSync(Sync):
    """Own mean-gradient step, then a gossip mix: GossipSGD's step (see the module docstring)."""

    def __init__(self, mix: Mixer, optimizer: Sgd | None = None, *, name: str = "nonblocking") -> None:
        self.inner = GossipSGD(mix, optimizer=optimizer, name=name)

    async def step(self, k: int, x: torch.Tensor, grad_sum: torch.Tensor, done: int, lr: float) -> tuple[
            torch.Tensor, int]:
        grad = grad_sum / done if done else torch.zeros_like(grad_sum)
        return await self.inner.step(k, x, grad, lr), done


def resolve_mixer(reference: str) -> MixerFactory:
    """The mixer factory named ``package.module:function``; ValueError naming the reference if there is none."""
    return resolve_callable(reference, what="mixer")


def build_gossip_sync(transport: Transport, optimizer: Sgd, reference: str, mixer_args: Mapping[str, Any], *,
                      timeout: float | None = None, name: str = "nonblocking") -> GossipSync:
    """A :class:`GossipSync` whose mixer is ``reference(transport, **mixer_args)`` (``timeout`` unless given)."""
    args = dict(mixer_args)
    args.setdefault("timeout", timeout)
    try:
        mix = resolve_mixer(reference)(transport, **args)
    except TypeError as exc:
        raise ValueError(f"mixer {reference!r} does not take mixer_args {sorted(args)} ({exc})") from exc
    return GossipSync(mix, optimizer, name=name)
