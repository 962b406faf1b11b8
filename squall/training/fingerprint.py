"""A parameter vector's fingerprint: hash, norm and a fixed random projection.

Written with every metrics record so that agreement and drift between workers can be measured
afterwards without shipping whole models: equal hashes mean bit-identical parameters; the
distance between two workers' projections estimates the distance between their parameters
(Johnson-Lindenstrauss: with ``k`` Gaussian rows scaled by ``1/sqrt(k)``, ``||P x - P y||^2`` is
an unbiased estimate of ``||x - y||^2``, relative spread about ``sqrt(2/k)``).

The projection matrix depends only on :data:`PROJECTION_SEED`, the dimension and ``k``, so every
worker of every run draws the same one. Above :data:`MAX_PROJECTED` parameters it covers a fixed
random subset of that many coordinates (sampled with the same seed) to keep the matrix small.
``span`` limits the projection to the leading coordinates (a task's model part, ballast excluded).

Cost: the hash reads every byte (about 1 ms per MB here); with megabytes of ballast, thin the
records (the loop's ``metrics_every``) if that time matters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

PROJECTION_SEED = 0x5C0A11
MAX_PROJECTED = 1 << 16
HASH_HEX = 16


@dataclass(frozen=True)
class Fingerprint:
    """What a metrics record says about the parameters."""

    hash: str  # first 16 hex digits of sha256 over the raw bytes
    norm: float  # Euclidean norm
    projection: tuple[float, ...]  # P x for the shared random matrix P


def param_hash(params: torch.Tensor) -> str:
    """sha256 of the parameter bytes (native layout), first 16 hex digits."""
    data = params.detach().contiguous().cpu().numpy()
    return hashlib.sha256(data.data).hexdigest()[:HASH_HEX]


class Projector:
    """``k`` fixed Gaussian directions in parameter space (see the module docstring)."""

    def __init__(self, dim: int, k: int = 8, *, span: int | None = None) -> None:
        span = dim if span is None else span
        if not (1 <= span <= dim and k >= 1):
            raise ValueError(f"need 1 <= span <= dim and k >= 1, got span={span}, dim={dim}, k={k}")
        gen = torch.Generator().manual_seed(PROJECTION_SEED)
        self.dim = dim
        self.span = span
        self.index: torch.Tensor | None = None
        if span > MAX_PROJECTED:
            self.index = torch.randperm(span, generator=gen)[:MAX_PROJECTED].sort().values
        cols = span if self.index is None else MAX_PROJECTED
        self.matrix = torch.randn(k, cols, generator=gen, dtype=torch.float64) / k**0.5

    def __call__(self, params: torch.Tensor) -> tuple[float, ...]:
        if params.numel() != self.dim:
            raise ValueError(f"projector is for {self.dim} parameters, got {params.numel()}")
        x = params.detach().reshape(-1)[: self.span]
        if self.index is not None:
            x = x[self.index]
        return tuple(float(v) for v in self.matrix @ x.double())

    def fingerprint(self, params: torch.Tensor) -> Fingerprint:
        """Hash, norm and projection of ``params``."""
        return Fingerprint(param_hash(params), float(torch.linalg.vector_norm(params.detach())), self(params))
