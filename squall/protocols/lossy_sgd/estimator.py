"""Reconstruction of a packet's block from the contributions that arrived (pure maths, no I/O).

An owner (or, without resync, every worker) holds for one packet of one iteration: its own block
``g_own``, the sum ``S`` of the other workers' blocks that arrived and their number ``k`` out of
``N - 1``. With i.i.d. loss of probability ``p`` that does not depend on the values:

* ``received_mean``: ``(g_own + S) / (1 + k)``. Unbiased for the mean when every contribution is
  lost alike (``symmetric``); the owner's own block never crosses the network, so in the protocol
  it carries weight ``E[1/(1+K)] = (1 - p^N) / (N (1-p))`` instead of ``1/N`` (K ~ Bin(N-1, 1-p)):
  biased towards the owner's own batch, unbiased over the data when shards are i.i.d.
* ``inverse_probability``: ``(g_own + S / (1 - p)) / N``: unbiased for the mean of the ``N`` blocks.
* ``zero_fill``: ``(g_own + S) / N`` (lost blocks count as zero): its mean is
  ``(g_own + (1-p) sum_others) / N``, i.e. ``1 - p (N-1) / N`` of the mean when blocks agree.
"""

from __future__ import annotations

import numpy as np
import torch

ESTIMATORS = ("received_mean", "inverse_probability", "zero_fill")


def reconstruct(own: torch.Tensor, others_sum: torch.Tensor, arrived: int | torch.Tensor, workers: int, *,
                estimator: str, loss: float = 0.0) -> torch.Tensor:
    """One packet's reconstructed mean block (see the module docstring).

    :param arrived: how many of the ``workers - 1`` other contributions arrived (their sum is ``others_sum``);
        a tensor broadcasting against the blocks reconstructs many trials at once.
    :param loss: p, used by ``inverse_probability`` only.
    """
    low, high = (int(arrived.min()), int(arrived.max())) if isinstance(arrived, torch.Tensor) else (arrived, arrived)
    if not 0 <= low <= high <= workers - 1:
        raise ValueError(f"arrived must be in [0, {workers - 1}], got {arrived}")
    if estimator == "received_mean":
        return (own + others_sum) / (1 + arrived)
    if estimator == "inverse_probability":
        if not 0 <= loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        return (own + others_sum / (1 - loss)) / workers
    if estimator == "zero_fill":
        return (own + others_sum) / workers
    raise ValueError(f"unknown estimator {estimator!r}; known: {list(ESTIMATORS)}")


def own_weight(workers: int, loss: float) -> float:
    """``E[1 / (1 + K)]``, K ~ Bin(N-1, 1-p): the owner's weight under ``received_mean``."""
    q = 1.0 - loss
    if q == 0:
        return 1.0
    return (1.0 - loss**workers) / (workers * q)


def zero_fill_factor(workers: int, loss: float) -> float:
    """Mean of ``zero_fill`` over the true mean when all blocks agree: ``1 - p (N-1) / N``."""
    return 1.0 - loss * (workers - 1) / workers


def trial_estimates(blocks: np.ndarray, loss: float, trials: int, *, estimator: str, seed: int,
                    symmetric: bool = False) -> np.ndarray:
    """``trials`` reconstructions of the mean of ``blocks`` (shape ``(N, d)``, row 0 the owner's).

    Each trial drops every other row with probability ``loss`` (and, with ``symmetric``, the
    owner's too: the trial's first arrived row then plays the owner's part, and a trial where
    nothing arrived is drawn again) and calls :func:`reconstruct` on all trials at once: the
    statistical test of the estimators (claim T7.1) uses the protocol's own code.
    """
    n, _ = blocks.shape
    rng = np.random.default_rng(seed)
    kept = rng.random((trials, n)) >= loss
    if symmetric:
        while not (empty := ~kept.any(axis=1)).all() and empty.any():
            kept[empty] = rng.random((int(empty.sum()), n)) >= loss
        if not kept.any(axis=1).all():
            raise ValueError("loss 1: nothing ever arrives")
    else:
        kept[:, 0] = True
    g = torch.from_numpy(np.asarray(blocks, dtype=np.float64))
    mask = torch.from_numpy(kept)
    first = mask.to(torch.int8).argmax(dim=1)  # the owner's row: 0, or the first arrived one
    own_mask = torch.zeros_like(mask)
    own_mask[torch.arange(trials), first] = True
    others_mask = (mask & ~own_mask).to(torch.float64)
    own, others = g[first], others_mask @ g
    arrived = others_mask.sum(dim=1, keepdim=True).to(torch.int64)
    return reconstruct(own, others, arrived, n, estimator=estimator, loss=loss).numpy()
