"""The :class:`Algorithm` interface the training loop drives, and the pieces algorithms are built from.

An algorithm owns everything that happens between "this rank has a gradient" and "this rank has
new parameters": communication, and the local optimiser applied where the protocol says. The
loop calls :meth:`Algorithm.step` once per iteration with the same ``k`` on every rank, and
:meth:`Algorithm.finish` once at the end.

Communication primitives are passed in as plain async callables so that the maths can be tested
with any transport (an exact in-process all-reduce in unit tests, the real collectives over TCP,
or ``torch.distributed``):

* :data:`Reducer` ``(tensor, round) -> mean over all ranks`` (bit-identical on every rank);
* :data:`Mixer` ``(x, round) -> sum_j W_ij x_j`` for this rank ``i`` and round's mixing matrix.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

import torch

from squall.training.optim import Sgd

#: The shapes of the tensors packed one after another in a flat parameter vector, in order.
Shapes = tuple[tuple[int, ...], ...]
#: ``async (tensor, round) -> mean of tensor over all ranks``; every rank calls it with the same round.
Reducer = Callable[[torch.Tensor, int], Awaitable[torch.Tensor]]
#: ``async (x, round) -> this rank's row of W(round) applied to everyone's x``.
Mixer = Callable[[torch.Tensor, int], Awaitable[torch.Tensor]]


class Algorithm(ABC):
    """One protocol's per-step update (see the module docstring).

    :param optimizer: the local optimiser (plain SGD by default); momentum and weight decay live here.
    """

    name: str = "algorithm"

    def __init__(self, *, optimizer: Sgd | None = None) -> None:
        self.optimizer = optimizer or Sgd()

    @abstractmethod
    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """New parameters after iteration ``k``, given this rank's gradient at ``params``.

        ``params`` must not be modified in place; return a new tensor (or ``params`` itself if unchanged).
        """

    async def finish(self, params: torch.Tensor) -> torch.Tensor:
        """Final parameters once the loop stops (e.g. a last averaging); by default ``params``."""
        return params

    def stats(self) -> dict[str, float]:
        """Extra per-step fields for the metrics records (e.g. a push-sum weight)."""
        return {}

    def bind_tensors(self, shapes: Shapes) -> None:
        """Told once, before the first step, which tensors the flat vector packs (the task's, in order).

        Most algorithms treat the vector as one; a compressor that works per tensor (ARC-Top-K's
        per-matrix sketch) keeps them. By default this does nothing.
        """
        return None

    def bind_names(self, names: tuple[str, ...]) -> None:
        """Told once, after :meth:`bind_tensors`, the names of those tensors where the task gives them
        (Streaming DiLoCo groups a transformer's blocks into fragments by name). By default nothing."""
        return None


class LocalOnly(Algorithm):
    """No communication: every rank trains alone on its shard (a lower bound for every protocol)."""

    name = "local"

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        return self.optimizer.update(params, grad, lr)
