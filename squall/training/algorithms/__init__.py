"""The :class:`Algorithm` interface the training loop drives, and the algorithms several protocols share.

The shared ``train`` job builds ``config["algorithm"]`` with ``config["algorithm_args"]`` as
options (:func:`squall.protocols.catalog.make_algorithm`). Each protocol folder declares the algorithms it
provides (:class:`~squall.training.declaration.AlgorithmDeclaration` in
``protocols/<folder>/protocol.py``); only ``local`` (no communication, a lower bound for every
protocol) is declared here, as :data:`LOCAL`. :mod:`~squall.training.algorithms.reduce` holds
all-reduce SGD and local SGD over any reducer.
"""

from __future__ import annotations

from squall.training.algorithms.base import Algorithm, LocalOnly, Mixer, Reducer
from squall.training.declaration import AlgorithmDeclaration
from squall.training.optim import Sgd
from squall.training.options import NoOptions
from squall.transport import Transport


def _local(transport: Transport, sgd: Sgd, options: NoOptions) -> Algorithm:
    return LocalOnly(optimizer=sgd)


#: No communication: every rank trains alone on its shard.
LOCAL = AlgorithmDeclaration(LocalOnly.name, _local, NoOptions)


__all__ = ["LOCAL", "Algorithm", "LocalOnly", "Mixer", "Reducer"]
