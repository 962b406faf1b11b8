"""DeMo's chunked DCT and per-chunk top-k: how a tensor is cut, transformed, sparsified and rebuilt. Pure torch."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most`` (1 for a prime larger than it)."""
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


@functools.cache
def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix ``D`` (``C = D x``, ``x = D^T C``), float32."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    d = torch.cos(math.pi * (i + 0.5) * k / n) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(torch.float32)


@dataclass(frozen=True)
class Plan:
    """How one tensor of ``shape`` is chunked: ``tiles`` chunks of ``rows x cols`` (1-d chunks: rows = 1)."""

    shape: tuple[int, ...]  # the tensor's shape
    rows: int  # chunk height (1 for 1-d chunks)
    cols: int  # chunk width
    keep: int  # coefficients kept per chunk: min(k, rows x cols)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def tile(self) -> int:
        """Elements per chunk."""
        return self.rows * self.cols

    @property
    def tiles(self) -> int:
        """Chunks in the tensor."""
        return self.numel // self.tile

    @property
    def entries(self) -> int:
        """(index, value) pairs the tensor sends per step."""
        return self.tiles * self.keep


def plan(shape: Sequence[int], *, chunk: int, k: int) -> Plan:
    """The chunking of a tensor: 2-d tensors in tiles, everything else (flattened) in 1-d chunks."""
    if chunk < 1 or k < 1:
        raise ValueError(f"chunk and k must be >= 1, got {chunk} and {k}")
    shape = tuple(int(s) for s in shape)
    if len(shape) == 2:
        rows, cols = largest_divisor(shape[0], chunk), largest_divisor(shape[1], chunk)
    else:
        rows, cols = 1, largest_divisor(max(math.prod(shape), 1), chunk)
    return Plan(shape, rows, cols, min(k, rows * cols))


def _tiles(x: torch.Tensor, p: Plan) -> torch.Tensor:
    """``x`` (flat) as ``(tiles, rows, cols)``."""
    if len(p.shape) == 2:
        r, c = p.shape
        return x.view(r // p.rows, p.rows, c // p.cols, p.cols).permute(0, 2, 1, 3).reshape(-1, p.rows, p.cols)
    return x.view(-1, 1, p.cols)


def _untile(t: torch.Tensor, p: Plan) -> torch.Tensor:
    """The inverse of :func:`_tiles`, flat."""
    if len(p.shape) == 2:
        r, c = p.shape
        return t.view(r // p.rows, c // p.cols, p.rows, p.cols).permute(0, 2, 1, 3).reshape(-1)
    return t.reshape(-1)


def dct(x: torch.Tensor, p: Plan) -> torch.Tensor:
    """Each chunk's DCT coefficients, ``(tiles, rows x cols)``."""
    t = _tiles(x, p)
    coeffs = dct_matrix(p.rows) @ t @ dct_matrix(p.cols).T
    return coeffs.reshape(p.tiles, p.tile)


def idct(coeffs: torch.Tensor, p: Plan) -> torch.Tensor:
    """The flat tensor whose chunks have the DCT coefficients ``coeffs`` (``(tiles, rows x cols)``)."""
    t = dct_matrix(p.rows).T @ coeffs.view(p.tiles, p.rows, p.cols) @ dct_matrix(p.cols)
    return _untile(t, p)


def top_k(coeffs: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (within each chunk) and values of each chunk's ``keep`` largest coefficients by magnitude."""
    index = coeffs.abs().topk(keep, dim=1, sorted=False).indices
    return index, coeffs.gather(1, index)


def scatter(index: torch.Tensor, values: torch.Tensor, p: Plan) -> torch.Tensor:
    """The ``(tiles, rows x cols)`` coefficients holding ``values`` at ``index`` and zeros elsewhere."""
    return torch.zeros(p.tiles, p.tile, dtype=values.dtype).scatter_(1, index, values)
