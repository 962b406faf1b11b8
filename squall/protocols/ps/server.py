"""The state a server rank keeps for its shard, and the optimiser it applies.

SGD with momentum and weight decay, in the convention of ``torch.optim.SGD`` (no dampening,
no Nesterov): ``g <- g + wd * p``, ``v <- mu v + g`` (``v = g`` at the first step), ``p <- p - lr v``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from squall.protocols.ps.sharding import PSLayout


@dataclass(frozen=True, slots=True)
class SGDConfig:
    """Optimiser of the servers."""

    lr: float  # learning rate
    momentum: float = 0.0  # heavy-ball coefficient mu
    weight_decay: float = 0.0  # L2 coefficient added to the gradient

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


class ServerShard:
    """One shard's parameters and optimiser state, held by the server rank that owns it.

    :param params: the shard's initial parameters (copied, flattened).
    :param config: the optimiser.
    :param start: offset of the shard in the flattened parameter vector.
    """

    def __init__(self, params: torch.Tensor, config: SGDConfig, *, start: int = 0) -> None:
        if not params.dtype.is_floating_point:
            raise ValueError(f"parameters must be floating point, got {params.dtype}")
        self.params = params.detach().reshape(-1).clone()
        self.config = config
        self.start = start
        self.steps = 0  # updates applied so far
        self._velocity: torch.Tensor | None = None

    @classmethod
    def for_rank(cls, layout: PSLayout, rank: int, initial: torch.Tensor, config: SGDConfig) -> ServerShard | None:
        """The shard ``rank`` serves, cut from the full ``initial`` parameters, or None if it serves none."""
        if not layout.is_server(rank):
            return None
        flat = initial.detach().reshape(-1)
        start, stop = layout.shard_range(rank, flat.numel())
        return cls(flat[start:stop], config, start=start)

    def apply(self, mean_grad: torch.Tensor) -> None:
        """One optimiser step with the averaged gradient of this shard."""
        grad = mean_grad.reshape(-1).to(self.params.dtype)
        if grad.numel() != self.params.numel():
            raise ValueError(f"gradient of {grad.numel()} elements for a shard of {self.params.numel()}")
        cfg = self.config
        if cfg.weight_decay:
            grad = grad + cfg.weight_decay * self.params
        if cfg.momentum:
            if self._velocity is None:
                self._velocity = grad.clone()
            else:
                self._velocity.mul_(cfg.momentum).add_(grad)
            grad = self._velocity
        self.params.add_(grad, alpha=-cfg.lr)
        self.steps += 1
