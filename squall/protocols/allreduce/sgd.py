"""All-reduce SGD and local SGD over our collectives.

The algorithms (:class:`~squall.training.algorithms.reduce.AllReduceSGD`,
:class:`~squall.training.algorithms.reduce.LocalSGD`) take any reducer and live in the common
layer; :func:`collective_reducer` adapts :func:`squall.collectives.allreduce` (exact, by the ring or
the butterfly schedule) to a :data:`~squall.training.algorithms.base.Reducer`. The builders at the
end are what :mod:`squall.protocols.allreduce.protocol` declares to the shared ``train`` job.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from squall.collectives import allreduce
from squall.training.algorithms.base import Algorithm, Reducer
from squall.training.algorithms.reduce import AllReduceSGD, LocalSGD
from squall.training.optim import Sgd
from squall.transport import Transport

#: Collectives by name (the schedule of :func:`squall.collectives.allreduce` that runs each) and the
#: options each takes.
COLLECTIVES: dict[str, frozenset[str]] = {
    "ring": frozenset({"chunk_bytes", "tag", "timeout"}),
    "butterfly": frozenset({"chunk_bytes", "tag", "timeout", "algorithm", "link"}),
}


def collective_reducer(transport: Transport, collective: str = "ring", **options: Any) -> Reducer:
    """A mean all-reduce over ``transport`` by :func:`squall.collectives.allreduce`'s ring or butterfly.

    :param options: passed on to the all-reduce (``chunk_bytes``, ``timeout``, the butterfly's ``algorithm`` ...).
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {sorted(COLLECTIVES)}")
    unknown = sorted(set(options) - COLLECTIVES[collective])
    if unknown:
        raise ValueError(f"{collective} all-reduce does not take options {unknown}; "
                         f"it takes {sorted(COLLECTIVES[collective])}")

    async def reduce(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await allreduce(transport, tensor, round=round, op="mean", schedule=collective, **options)

    return reduce


@dataclass(frozen=True)
class CollectiveOptions:
    """``allreduce``'s options (``algorithm_args``): the collective, and the options of :data:`COLLECTIVES`.

    An option left out (None) is the all-reduce's default; one the chosen collective does not take
    is refused by :func:`collective_reducer`.
    """

    collective: str = "ring"  # a key of COLLECTIVES
    chunk_bytes: int | None = None  # pipelining chunk
    tag: int | None = None  # message tag of the all-reduce
    timeout: float | None = None  # per send/receive (None: the transport's default)
    algorithm: str | None = None  # butterfly only: its algorithm ("auto" by default)
    link: Any = None  # butterfly only: the link model its choice is made for

    def given(self) -> dict[str, Any]:
        """The collective's options that were given (not None), for :func:`collective_reducer`."""
        return {f.name: getattr(self, f.name) for f in fields(CollectiveOptions)
                if f.name != "collective" and getattr(self, f.name) is not None}

    def reducer(self, transport: Transport) -> Reducer:
        """The mean all-reduce these options describe."""
        return collective_reducer(transport, self.collective, **self.given())


@dataclass(frozen=True)
class LocalSgdOptions(CollectiveOptions):
    """``local_sgd``'s options: the averaging period, and the collective's (:class:`CollectiveOptions`)."""

    period: int = 8  # local steps between averages
    average_at_end: bool = True  # average once more after the last step


def build_allreduce(transport: Transport, sgd: Sgd, options: CollectiveOptions) -> Algorithm:
    """Builder of ``allreduce`` (options: :class:`CollectiveOptions`)."""
    return AllReduceSGD(options.reducer(transport), optimizer=sgd)


def build_local_sgd(transport: Transport, sgd: Sgd, options: LocalSgdOptions) -> Algorithm:
    """Builder of ``local_sgd`` (options: :class:`LocalSgdOptions`)."""
    return LocalSGD(options.reducer(transport), period=options.period, optimizer=sgd,
                    average_at_end=options.average_at_end)
