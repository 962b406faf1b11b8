"""Regularised least squares with a closed-form optimum, heterogeneous across ranks.

The data set has ``groups`` blocks of ``rows_per_group`` rows. Block ``g`` is generated from its
own solution ``x_g = x_c + heterogeneity * z_g`` (``x_c, z_g ~ N(0, I)``)::

    a ~ N(0, diag(s)^2),  b = a . x_g + noise * N(0, 1)

with column scales ``s`` log-spaced from 1 down to ``1/sqrt(condition)``, so the Hessian's
spectrum spans about ``condition``. The objective over all ``N`` rows is::

    f(x) = 1/(2N) ||A x - b||^2 + l2/2 ||x||^2,    x* = (A^T A / N + l2 I)^{-1} A^T b / N

which is strongly convex (``l2 > 0``) with the unique minimiser ``x*`` computed in float64.
The group is the sharding label: the default ``label`` sharding (one piece per rank) gives each
rank a contiguous run of blocks, so
ranks' local optima differ (``heterogeneity`` sets by how much) while the global one is known.
When every rank holds the same number of rows (``iid`` and ``label`` sharding) ``f`` is also the
plain average of the ranks' local objectives, i.e. what decentralized methods minimise; uneven
``dirichlet`` shards weight ranks unequally and ``x*`` is then the sample-weighted optimum.

The data depends on ``data_seed`` only (not on the run's seed), so ``x*`` is the same for every
run. :meth:`evaluate` reports ``loss`` = f(x), ``suboptimality`` = f(x) - f(x*) and ``distance``
= ||x - x*||.
"""

from __future__ import annotations

import numpy as np
import torch

from squall.training.tasks.base import Batch, ParamLayout, SupervisedTask
from squall.training.tasks.sharding import Sharding, derive_seed

SEED_DATA = 0xDA7A


class LeastSquares(SupervisedTask):
    """Strongly convex quadratic with a known optimum (see the module docstring)."""

    name = "quadratic"

    def __init__(
        self,
        *,
        dim: int = 20,
        groups: int = 8,
        rows_per_group: int = 64,
        heterogeneity: float = 1.0,
        noise: float = 0.1,
        l2: float = 0.01,
        condition: float = 10.0,
        data_seed: int = 0,
        sharding: Sharding | None = None,
    ) -> None:
        if dim < 1 or groups < 1 or rows_per_group < 1:
            raise ValueError("dim, groups and rows_per_group must be >= 1")
        if not l2 > 0:
            raise ValueError(f"l2 must be > 0 for strong convexity, got {l2}")
        if not condition >= 1:
            raise ValueError(f"condition must be >= 1, got {condition}")
        gen = torch.Generator().manual_seed(derive_seed(data_seed, SEED_DATA))
        n = groups * rows_per_group
        scales = torch.logspace(0.0, -0.5 * float(np.log10(condition)), dim, dtype=torch.float64)
        a = torch.randn(n, dim, generator=gen, dtype=torch.float64) * scales
        center = torch.randn(dim, generator=gen, dtype=torch.float64)
        solutions = center + heterogeneity * torch.randn(groups, dim, generator=gen, dtype=torch.float64)
        group = torch.arange(n) // rows_per_group
        b = (a * solutions[group]).sum(dim=1) + noise * torch.randn(n, generator=gen, dtype=torch.float64)
        super().__init__(
            layout=ParamLayout((("x", (dim,)),)),
            groups=group.numpy(),
            sharding=sharding or Sharding(kind="label", shards_per_rank=1),
        )
        self.l2 = l2
        self.a64, self.b64 = a, b
        self.a, self.b = a.float(), b.float()
        hessian = a.T @ a / n + l2 * torch.eye(dim, dtype=torch.float64)
        self.optimum = torch.linalg.solve(hessian, a.T @ b / n)  # float64
        self.optimal_loss = self._full_loss(self.optimum)

    def init_params(self, seed: int) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=torch.float32)

    def gather(self, indices: torch.Tensor) -> Batch:
        return self.a[indices], self.b[indices]

    def loss(self, params: torch.Tensor, batch: Batch) -> torch.Tensor:
        a, b = batch
        residual = a.to(params.dtype) @ params - b.to(params.dtype)
        return 0.5 * (residual * residual).mean() + 0.5 * self.l2 * (params * params).sum()

    def _full_loss(self, x64: torch.Tensor) -> float:
        return float(self.loss(x64, (self.a64, self.b64)))

    def distance_to_optimum(self, params: torch.Tensor) -> float:
        """``||params - x*||``."""
        return float(torch.linalg.vector_norm(params.detach().double() - self.optimum))

    @torch.no_grad()
    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        x = params.detach().double()
        loss = self._full_loss(x)
        return {"loss": loss, "suboptimality": loss - self.optimal_loss, "distance": self.distance_to_optimum(x)}

    def local_optimum(self, rank: int, world: int, seed: int) -> torch.Tensor:
        """The minimiser of ``rank``'s own objective (float64): how far heterogeneity pulls it."""
        idx = torch.from_numpy(self.shard(rank, world, seed))
        a, b = self.a64[idx], self.b64[idx]
        hessian = a.T @ a / len(idx) + self.l2 * torch.eye(self.dim, dtype=torch.float64)
        solution: torch.Tensor = torch.linalg.solve(hessian, a.T @ b / len(idx))
        return solution
