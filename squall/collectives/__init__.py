"""Collectives: ring and butterfly all-reduce over a :class:`~squall.transport.Transport`.

* :mod:`~squall.collectives.schedule`: pure schedules (who sends which range to whom);
* :mod:`~squall.collectives.cost`: alpha-beta cost models and the ``"auto"`` size rule;
* :mod:`~squall.collectives.ops`: reduction operators and received-piece checks;
* :mod:`~squall.collectives.exchange`: async helpers (chunked send/receive, full duplex);
* :mod:`~squall.collectives.ring`: chunk-pipelined ring all-reduce;
* :mod:`~squall.collectives.butterfly`: Rabenseifner and recursive doubling, any ``n``.
"""

from __future__ import annotations

from squall.collectives.butterfly import BUTTERFLY_TAG, butterfly_allreduce, resolve_algorithm
from squall.collectives.cost import (
    DEFAULT_LINK,
    LinkModel,
    choose_butterfly,
    doubling_time,
    rabenseifner_time,
    ring_time,
)
from squall.collectives.exchange import Channel, concurrently, run_inproc, run_ranks
from squall.collectives.ops import REDUCE_OPS, CollectiveError, ReduceOp
from squall.collectives.ring import RING_TAG, ring_allreduce

__all__ = [
    "BUTTERFLY_TAG",
    "DEFAULT_LINK",
    "REDUCE_OPS",
    "RING_TAG",
    "Channel",
    "CollectiveError",
    "LinkModel",
    "ReduceOp",
    "butterfly_allreduce",
    "choose_butterfly",
    "concurrently",
    "doubling_time",
    "rabenseifner_time",
    "resolve_algorithm",
    "ring_allreduce",
    "ring_time",
    "run_inproc",
    "run_ranks",
]
