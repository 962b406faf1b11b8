"""Parameter-server SGD on the sharded servers of this package.

Every rank is a worker; ranks ``0..num_servers-1`` also hold one contiguous shard of the
parameters each (co-located servers, ``PSLayout(dedicated=False)``). Per step the
workers push their gradient ranges, each server averages them, applies SGD (momentum, weight
decay) to its shard and every worker pulls the fresh vector back, so all ranks hold identical
parameters, equal to one optimiser step on the mean gradient.

The optimiser runs on the servers: the local :class:`~squall.training.optim.Sgd` only supplies
its settings (Nesterov is not supported there), and the learning rate of each step is handed to
the servers when the schedule changes it. Dedicated server ranks (which compute no gradient)
would hold only their own shard fresh, so the shared loop does not offer them.

:func:`build_ps` is what :mod:`squall.protocols.ps.protocol` declares to the ``train`` job.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from squall.protocols.ps.server import ServerShard, SGDConfig
from squall.protocols.ps.sharding import PSLayout
from squall.protocols.ps.step import ps_step
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.transport import Transport


class ParameterServerSGD(Algorithm):
    """Synchronous SGD through sharded, co-located parameter servers (see the module docstring).

    :param num_servers: shards, on ranks ``0..num_servers-1``.
    """

    name = "ps"

    def __init__(
        self, transport: Transport, *, num_servers: int = 1, optimizer: Sgd | None = None, timeout: float | None = None
    ) -> None:
        super().__init__(optimizer=optimizer)
        if self.optimizer.config.nesterov:
            raise ValueError("the parameter servers' SGD has no Nesterov variant")
        self.transport = transport
        self.layout = PSLayout(transport.world_size, num_servers)
        self.timeout = timeout
        self._server: ServerShard | None = None
        self._started = False

    def _server_config(self, lr: float) -> SGDConfig:
        cfg = self.optimizer.config
        return SGDConfig(lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if not self._started:
            self._server = ServerShard.for_rank(
                self.layout, self.transport.rank, params, self._server_config(lr)
            )
            self._started = True
        elif self._server is not None and self._server.config.lr != lr:
            self._server.config = self._server_config(lr)
        out = await ps_step(self.transport, self.layout, grad, round=k, server=self._server, timeout=self.timeout)
        assert out is not None, "every rank is a worker here, and workers get the parameters back"
        return out


@dataclass(frozen=True)
class PsOptions:
    """The parameter server's options (``algorithm_args``)."""

    num_servers: int = 1  # ranks that also hold a shard of the parameters
    timeout: float | None = None  # per send/receive (None: the transport's default)


def build_ps(transport: Transport, sgd: Sgd, options: PsOptions) -> Algorithm:
    """Builder of ``ps`` (options: :class:`PsOptions`)."""
    return ParameterServerSGD(transport, num_servers=options.num_servers, optimizer=sgd, timeout=options.timeout)
