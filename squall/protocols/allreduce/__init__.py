"""Synchronous data-parallel SGD on an exact all-reduce, and local SGD (periodic averaging).

* :mod:`~squall.protocols.allreduce.sgd`: :func:`collective_reducer` over the ring or butterfly of
  :mod:`squall.collectives`, and the builders of the common layer's all-reduce SGD and local SGD;
* :mod:`~squall.protocols.allreduce.protocol`: the names ``ring``, ``butterfly`` and ``local_sgd``.
"""

from __future__ import annotations

from squall.protocols.allreduce.sgd import COLLECTIVES, collective_reducer

__all__ = ["COLLECTIVES", "collective_reducer"]
