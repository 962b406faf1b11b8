"""ARC-Top-K's claims as pure numpy experiments: the heterogeneous synthetic (T6.2) and the contraction trials (T6.1).

T6.2: a "shifted objective" in the spirit of the paper's synthetic benchmark (our own code). ``n``
nodes hold ``w`` in ``R^{rows x cols}``; row ``signal`` is the signal ``w_s``, rows ``0 .. noisy-1``
are nuisance rows ``w_r``. Half the nodes see every nuisance row pulled towards
``+shift + gamma w_s``, the other half towards ``-shift - gamma w_s``::

    f_i(w) = 1/2 ||w_s - target||^2 + 1/(2 noisy) sum_r ||w_r - xi_i - gamma_i w_s||^2

The average objective's optimum has ``w_r* = 0`` and ``w_s* = (target - mean(gamma xi)) /
(1 + mean(gamma^2))``, but each node's gradient is dominated by its own huge shift on the nuisance
rows, so a node's *local* Top-K keeps sending nuisance rows whose contributions cancel only on
average, and error feedback cannot make up for rows nobody selects in time: an error floor.
ARC-Top-K selects rows of the *mean* gradient, where the shifts cancel, and converges like the
uncompressed run. Every variant runs EF21-M as the paper's script does (``v = beta v + g``;
``e_i += C(v_i - e_i)``; step along ``mean_i e_i``).

T6.1: :func:`contraction_trials` draws random heterogeneous gradients on ``n`` workers and
measures ``||C(G) - G||^2 / ((1 - k/rows) ||G||^2)`` for the aggregate ``G`` with an exact sketch
(must be <= 1) and a rank-``r`` one (within a slack in most trials).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from squall.training.compress import arc
from squall.training.compress.topk import top_k_indices

Array = npt.NDArray[np.float64]
#: The compressors T6.2 compares.
VARIANTS = ("uncompressed", "local_topk", "arc_topk", "arc_topk_exact")


@dataclass(frozen=True, slots=True)
class Shifted:
    """The shifted objective's settings (the paper script's: 10 nodes, 200 x 10, 150 nuisance rows)."""

    nodes: int = 10
    rows: int = 200
    cols: int = 10
    noisy: int = 150  # nuisance rows 0 .. noisy-1; row ``noisy`` is the signal
    shift: float = 100.0
    gamma: float = 5.0
    target: float = 1.0
    lr: float = 1e-3
    beta: float = 0.5
    steps: int = 1000
    noise: float = 1e-3  # gradient noise (standard deviation)
    rank: int = 2  # sketch rank

    def __post_init__(self) -> None:
        if not 0 < self.noisy < self.rows or self.nodes < 2:
            raise ValueError(f"shifted objective: need 0 < noisy < rows and nodes >= 2, got {self}")

    def signs(self) -> Array:
        """+1 for the first half of the nodes, -1 for the rest."""
        return np.where(np.arange(self.nodes) < self.nodes // 2, 1.0, -1.0)

    def optimum(self) -> Array:
        """``w*`` as a ``rows x cols`` matrix."""
        s = self.signs()
        xi, gam = self.shift * s, self.gamma * s
        w = np.zeros((self.rows, self.cols))
        w[self.noisy] = (self.target - np.mean(gam * xi)) / (1 + np.mean(gam * gam))
        w[: self.noisy] = np.mean(xi) + np.mean(gam) * w[self.noisy]
        return w

    def gradients(self, w: Array, rng: np.random.Generator) -> Array:
        """Every node's gradient at ``w``, ``nodes x rows x cols``."""
        s = self.signs()[:, None, None]
        ws = w[self.noisy][None, None, :]
        residual = w[None, : self.noisy] - self.shift * s - self.gamma * s * ws  # nodes x noisy x cols
        g = np.zeros((self.nodes, self.rows, self.cols))
        g[:, : self.noisy] = residual / self.noisy
        pull = (self.gamma * self.signs())[:, None] * residual.sum(axis=1)  # nodes x cols
        g[:, self.noisy] = (w[self.noisy] - self.target)[None, :] - pull / self.noisy
        if self.noise:
            g += rng.normal(0.0, self.noise, size=g.shape)
        return g


def _local_topk(d: Array, k: int, rng: np.random.Generator, rank: int) -> Array:
    out = np.zeros_like(d)
    for i in range(d.shape[0]):
        rows = top_k_indices(np.einsum("ij,ij->i", d[i], d[i]), k)
        out[i, rows] = d[i, rows]
    return out


def _arc(exact: bool) -> Callable[[Array, int, np.random.Generator, int], Array]:
    def compress(d: Array, k: int, rng: np.random.Generator, rank: int) -> Array:
        mean = d.mean(axis=0)
        scores_of = mean if exact else mean @ rng.standard_normal((d.shape[2], rank))
        rows = top_k_indices(np.einsum("ij,ij->i", scores_of, scores_of), k)
        out = np.zeros_like(d)
        out[:, rows] = d[:, rows]
        return out

    return compress


def _none(d: Array, k: int, rng: np.random.Generator, rank: int) -> Array:
    return d


COMPRESS = {"uncompressed": _none, "local_topk": _local_topk, "arc_topk": _arc(False), "arc_topk_exact": _arc(True)}


def shifted_distance(variant: str, ratio: float, *, problem: Shifted | None = None, seed: int = 0) -> float:
    """``||w - w*||`` after ``problem.steps`` EF21-M steps, ``variant``'s compressor keeping ``ratio`` of the rows."""
    if variant not in COMPRESS:
        raise ValueError(f"variant {variant!r} is not one of {list(VARIANTS)}")
    p = problem or Shifted()
    k = max(1, min(p.rows, int(np.ceil(ratio * p.rows))))
    rng = np.random.default_rng(seed)
    w = np.zeros((p.rows, p.cols))
    v = np.zeros((p.nodes, p.rows, p.cols))
    e = np.zeros_like(v)
    compress = COMPRESS[variant]
    for _ in range(p.steps):
        v = p.beta * v + p.gradients(w, rng)
        e = e + compress(v - e, k, rng, p.rank)
        w = w - p.lr * e.mean(axis=0)
        if not np.isfinite(w).all() or np.abs(w).max() > 1e8:
            return float("inf")
    return float(np.linalg.norm(w - p.optimum()))


@dataclass(frozen=True, slots=True)
class ContractionTrials:
    """T6.1 checks 2 and 3 over many random trials."""

    trials: int
    exact_max: float  # the largest ||C(G) - G||^2 / ((1 - k/rows) ||G||^2) with the exact sketch (<= 1)
    sketch_within: float  # fraction of trials where the rank-r sketch's ratio is <= slack
    sketch_median: float  # median of the rank-r sketch's ratio


def contraction_trials(*, trials: int = 1000, workers: int = 8, rows: int = 64, cols: int = 16, ratio: float = 0.1,
                       rank: int = 4, slack: float = 1.1, spread: float = 1.0, seed: int = 0) -> ContractionTrials:
    """Random heterogeneous gradients; see the module docstring.

    Each trial draws row scales ``exp(N(0, spread^2))``, a common part and a per-worker part of the
    same size (workers disagree as much as they agree); ``spread = 0`` makes every row alike, the
    hardest case for any selection.
    """
    rng = np.random.default_rng(seed)
    segments = arc.plan(rows * cols, cols=cols)
    k = arc.selected_rows(segments[0], ratio)
    bound = 1.0 - k / rows
    exact: list[float] = []
    sketched: list[float] = []
    for t in range(trials):
        scale = np.exp(rng.normal(0.0, spread, size=(rows, 1)))
        common = rng.standard_normal((rows, cols)) * scale
        grads = [(common + rng.standard_normal((rows, cols)) * scale).reshape(-1) for _ in range(workers)]
        mean = np.mean(grads, axis=0)
        for is_exact, out in ((True, exact), (False, sketched)):
            c, _ = arc.compress_mean(grads, segments, ratio=ratio, rank=rank, seed=seed * 100_003 + t, exact=is_exact)
            out.append(arc.contraction_ratio(c, mean) / bound)
    return ContractionTrials(
        trials=trials,
        exact_max=float(max(exact)),
        sketch_within=float(np.mean(np.asarray(sketched) <= slack)),
        sketch_median=float(np.median(sketched)),
    )
