"""Algorithms the training loop can run, and :func:`make_algorithm` to build one by name.

=============  ==========================================================  =========================
name           what                                                        options
=============  ==========================================================  =========================
``local``      no communication                                            --
``allreduce``  gradient all-reduce (mean), synchronous SGD                 collective, chunk_bytes
``local_sgd``  ``period`` local steps, then a parameter all-reduce         period, collective, ...
``dpsgd``      local step, then gossip with a fixed graph                  topology, weights
``sgp``        Stochastic Gradient Push on SGP's exponential digraph       peers_per_round
``matcha``     local step, then gossip on randomly activated matchings     topology, budget, seed
``ps``         sharded parameter servers co-located on ranks 0..S-1        num_servers
=============  ==========================================================  =========================

``collective`` is ``ring`` or ``butterfly`` (:mod:`protocols.collectives`); further collective
options (``chunk_bytes``, ``algorithm`` for the butterfly) are passed through. The protocol
packages are imported only when an algorithm needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from protocols.common.algorithms.allreduce import AllReduceSGD, LocalSGD, collective_reducer
from protocols.common.algorithms.base import Algorithm, LocalOnly, Mixer, Reducer
from protocols.common.algorithms.gossip import GossipSGD, PushSumSGD, build_graph, graph_mixer, matcha_mixer
from protocols.common.algorithms.server import ParameterServerSGD
from protocols.common.optim import Sgd
from protocols.transport import Transport

Builder = Callable[[Transport, Sgd, dict[str, Any]], Algorithm]


def _take(options: dict[str, Any], key: str, default: Any) -> Any:
    return options.pop(key, default)


def _local(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    return LocalOnly(optimizer=sgd)


def _allreduce(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    collective = str(_take(options, "collective", "ring"))
    reduce = collective_reducer(transport, collective, **_drain(options))
    return AllReduceSGD(reduce, optimizer=sgd)


def _local_sgd(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    period = int(_take(options, "period", 8))
    at_end = bool(_take(options, "average_at_end", True))
    collective = str(_take(options, "collective", "ring"))
    reduce = collective_reducer(transport, collective, **_drain(options))
    return LocalSGD(reduce, period=period, optimizer=sgd, average_at_end=at_end)


def _dpsgd(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    mix = graph_mixer(
        transport,
        str(_take(options, "topology", "ring")),
        weights=str(_take(options, "weights", "metropolis")),
        timeout=_take(options, "timeout", None),
    )
    return GossipSGD(mix, optimizer=sgd)


def _sgp(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    return PushSumSGD(
        transport,
        peers_per_round=int(_take(options, "peers_per_round", 1)),
        optimizer=sgd,
        timeout=_take(options, "timeout", None),
    )


def _matcha(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    mix = matcha_mixer(
        transport,
        str(_take(options, "topology", "exponential")),
        budget=float(_take(options, "budget", 0.5)),
        seed=int(_take(options, "seed", 0)),
        timeout=_take(options, "timeout", None),
    )
    return GossipSGD(mix, optimizer=sgd, name="matcha")


def _ps(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    return ParameterServerSGD(
        transport,
        num_servers=int(_take(options, "num_servers", 1)),
        optimizer=sgd,
        timeout=_take(options, "timeout", None),
    )


def _drain(options: dict[str, Any]) -> dict[str, Any]:
    rest = dict(options)
    options.clear()
    return rest


BUILDERS: dict[str, Builder] = {
    "local": _local,
    "allreduce": _allreduce,
    "local_sgd": _local_sgd,
    "dpsgd": _dpsgd,
    "sgp": _sgp,
    "matcha": _matcha,
    "ps": _ps,
}


def make_algorithm(
    name: str, transport: Transport, *, optimizer: Sgd | None = None, options: Mapping[str, Any] | None = None
) -> Algorithm:
    """The algorithm ``name`` over ``transport`` with ``options`` (see the module docstring).

    :raises ValueError: unknown name or option.
    """
    builder = BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(BUILDERS)}")
    remaining = dict(options or {})
    algorithm = builder(transport, optimizer or Sgd(), remaining)
    if remaining:
        raise ValueError(f"algorithm {name!r} does not take options {sorted(remaining)}")
    return algorithm


__all__ = [
    "BUILDERS",
    "Algorithm",
    "AllReduceSGD",
    "GossipSGD",
    "LocalOnly",
    "LocalSGD",
    "Mixer",
    "ParameterServerSGD",
    "PushSumSGD",
    "Reducer",
    "build_graph",
    "collective_reducer",
    "graph_mixer",
    "make_algorithm",
    "matcha_mixer",
]
