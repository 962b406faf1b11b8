"""Collectives over a :class:`~squall.transport.Transport`: one all-reduce that takes a compressor, and its schedules.

The entry point is :func:`allreduce` (:mod:`~squall.collectives.allreduce`):
``await allreduce(transport, tensor, round=k, op="mean", compression=None or a compressor)``; the
compressor's declared properties choose the schedule (that module's docstring has the table).
:func:`bind` gives it bound to a transport, the form :class:`~squall.training.compress.CompressedSGD`
takes; :func:`sent_bytes` the exact bytes a rank sends per call.

* :mod:`~squall.collectives.schedule`: pure schedules (who sends which range to whom);
* :mod:`~squall.collectives.cost`: alpha-beta cost models and the ``"auto"`` size rule;
* :mod:`~squall.collectives.ops`: reduction operators and received-piece checks;
* :mod:`~squall.collectives.exchange`: async helpers (chunked send/receive, full duplex);
* :mod:`~squall.collectives.ring`: chunk-pipelined ring all-reduce of a dense tensor;
* :mod:`~squall.collectives.butterfly`: Rabenseifner and recursive doubling, any ``n``;
* :mod:`~squall.collectives.shared`: the index-free ring over a shared support (Rand-K, ARC-Top-K);
* :mod:`~squall.collectives.allgather`: all-gather of compressed payloads (Top-K);
* :mod:`~squall.collectives.requant`: the two-step and per-hop requantizing all-reduces (INT8/INT4).

:func:`ring_allreduce` and :func:`butterfly_allreduce` stay importable for the dense all-reduces
that need none of the above (they are what :func:`allreduce` runs without compression).
"""

from __future__ import annotations

from squall.collectives.allreduce import SCHEDULES, allreduce, bind, choose_schedule, sent_bytes
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
    "SCHEDULES",
    "Channel",
    "CollectiveError",
    "LinkModel",
    "ReduceOp",
    "allreduce",
    "bind",
    "butterfly_allreduce",
    "choose_butterfly",
    "choose_schedule",
    "concurrently",
    "doubling_time",
    "rabenseifner_time",
    "resolve_algorithm",
    "ring_allreduce",
    "ring_time",
    "run_inproc",
    "run_ranks",
    "sent_bytes",
]
