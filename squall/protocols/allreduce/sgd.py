"""All-reduce SGD and local SGD over our collectives.

The algorithms (:class:`~squall.training.algorithms.reduce.AllReduceSGD`,
:class:`~squall.training.algorithms.reduce.LocalSGD`) take any reducer and live in the common
layer; :func:`collective_reducer` adapts :func:`squall.collectives.allreduce` (exact, by the ring or
the butterfly schedule) to a :data:`~squall.training.algorithms.base.Reducer`. The builders at the
end are what :mod:`squall.protocols.allreduce.protocol` declares to the shared ``train`` job.
"""

from __future__ import annotations

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


def build_allreduce(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``allreduce``: options ``collective`` (ring), then the collective's own."""
    collective = str(options.pop("collective", "ring"))
    reduce = collective_reducer(transport, collective, **_drain(options))
    return AllReduceSGD(reduce, optimizer=sgd)


def build_local_sgd(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``local_sgd``: ``period`` (8), ``average_at_end`` (true), ``collective`` and its options."""
    period = int(options.pop("period", 8))
    at_end = bool(options.pop("average_at_end", True))
    collective = str(options.pop("collective", "ring"))
    reduce = collective_reducer(transport, collective, **_drain(options))
    return LocalSGD(reduce, period=period, optimizer=sgd, average_at_end=at_end)


def _drain(options: dict[str, Any]) -> dict[str, Any]:
    """Everything left in ``options`` (handed to the collective, which checks it), leaving it empty."""
    rest = dict(options)
    options.clear()
    return rest
