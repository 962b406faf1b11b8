"""All-reduce SGD and local SGD over our collectives.

The algorithms (:class:`~squall.training.algorithms.reduce.AllReduceSGD`,
:class:`~squall.training.algorithms.reduce.LocalSGD`) take any reducer and live in the common
layer; :func:`collective_reducer` adapts the collectives of :mod:`squall.collectives` (imported
lazily) to a :data:`~squall.training.algorithms.base.Reducer`. The builders at the end are what
:mod:`squall.protocols.allreduce.protocol` declares to the shared ``train`` job.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from squall.training.algorithms.base import Algorithm, Reducer
from squall.training.algorithms.reduce import AllReduceSGD, LocalSGD
from squall.training.optim import Sgd
from squall.transport import Transport

#: Collectives by name: the function of :mod:`squall.collectives` that runs each.
COLLECTIVES = {"ring": "ring_allreduce", "butterfly": "butterfly_allreduce"}


def collective_reducer(transport: Transport, collective: str = "ring", **options: Any) -> Reducer:
    """A mean all-reduce over ``transport`` by ``squall.collectives``' ring or butterfly.

    :param options: passed on to the collective (``chunk_bytes``, ``timeout``, ``algorithm`` ...).
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {sorted(COLLECTIVES)}")
    function = getattr(importlib.import_module("squall.collectives"), COLLECTIVES[collective])
    try:
        inspect.signature(function).bind(transport, torch.empty(0), round=0, op="mean", **options)
    except TypeError as exc:
        raise ValueError(f"{collective} all-reduce does not take options {sorted(options)}: {exc}") from exc

    async def reduce(tensor: torch.Tensor, round: int) -> torch.Tensor:
        out: torch.Tensor = await function(transport, tensor, round=round, op="mean", **options)
        return out

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
