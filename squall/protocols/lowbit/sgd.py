"""All-reduce SGD over a low-bit mean all-reduce: :func:`squall.collectives.allreduce` with a
:class:`~squall.training.compress.GroupQuant` compressor, by the two-step schedule or the per-hop ring."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from squall.collectives import allreduce
from squall.training.algorithms.base import Algorithm, Reducer
from squall.training.algorithms.reduce import AllReduceSGD
from squall.training.compress import GroupQuant
from squall.training.optim import Sgd
from squall.transport import Transport

TWO_STEP = "lowbit_allreduce"  # Flash Communication's two-step all-reduce
RING = "lowbit_ring"  # the control: requantize at every ring hop
#: The all-reduce schedule of each protocol.
SCHEDULES = {TWO_STEP: "two_step", RING: "ring"}


@dataclass(frozen=True, slots=True)
class LowBitConfig:
    """The quantization of a low-bit all-reduce: both protocols' options (``algorithm_args``)."""

    bits: int = 8  # 8 or 4
    group: int = 128  # elements per scale and zero point
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        self.compressor()  # checks bits and group

    def compressor(self) -> GroupQuant:
        """The quantizer every payload is encoded with."""
        return GroupQuant(bits=self.bits, group=self.group)


def lowbit_reducer(transport: Transport, collective: str, config: LowBitConfig) -> Reducer:
    """A mean all-reduce by ``collective`` (``lowbit_allreduce`` or ``lowbit_ring``), in the tensor's dtype."""
    schedule = SCHEDULES.get(collective)
    if schedule is None:
        raise ValueError(f"unknown low-bit collective {collective!r}; allowed: {sorted(SCHEDULES)}")
    compressor = config.compressor()

    async def reduce(tensor: torch.Tensor, round: int) -> torch.Tensor:
        out = await allreduce(transport, tensor, round=round, op="mean", compression=compressor, schedule=schedule,
                              timeout=config.timeout)
        return out.to(tensor.dtype)

    return reduce


def _named(algorithm: AllReduceSGD, name: str) -> Algorithm:
    algorithm.name = name  # the protocol's algorithm name, in metrics
    return algorithm


def build_two_step(transport: Transport, sgd: Sgd, config: LowBitConfig) -> Algorithm:
    """Builder of ``lowbit_allreduce`` (options: :class:`LowBitConfig`)."""
    return _named(AllReduceSGD(lowbit_reducer(transport, TWO_STEP, config), optimizer=sgd), TWO_STEP)


def build_ring(transport: Transport, sgd: Sgd, config: LowBitConfig) -> Algorithm:
    """Builder of ``lowbit_ring`` (options: :class:`LowBitConfig`)."""
    return _named(AllReduceSGD(lowbit_reducer(transport, RING, config), optimizer=sgd), RING)
