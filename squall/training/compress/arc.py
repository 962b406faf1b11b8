"""ARC-Top-K's maths: a shared Gaussian sketch picks the same rows on every worker (Chen et al., arXiv 2510.26709).

Top-K on each worker picks different coordinates, so the workers must all-gather values *and*
indices. ARC-Top-K makes the choice global and cheap instead. Per step and per gradient matrix
``G_i`` (``rows x cols``) on worker ``i``:

1. every worker draws the same Gaussian ``V`` (``cols x r``) from a per-step shared seed and
   computes the sketch ``P_i = G_i V`` (``rows x r``);
2. the sketches are all-reduced (mean): ``P = (mean_i G_i) V``;
3. each row scores ``||P_row||^2`` and the top ``k = max(1, floor(ratio rows))`` rows are selected:
   the same rows everywhere, so no index is sent;
4. each worker packs its selected rows ``G_i[idx]`` (``k x cols``) and all-reduces them (mean); the
   result is scattered back into a zero matrix.

With an exact sketch (``V = I``) row selection is linear in the gradients, ``mean_i C(G_i) =
C(mean_i G_i)``, and picking the top rows of the mean contracts the aggregate:
``||C(G) - G||^2 <= (1 - k/rows) ||G||^2`` (:func:`contraction_ratio`). A rank-``r`` sketch keeps
this approximately (Johnson-Lindenstrauss): T6.1 (docs/protocols/compression.md) checks it within a slack of 1.1.

Shapes, as the paper's DDP hook does them (:func:`matrix_shape`): a 2-d tensor is its own matrix;
a tensor of more dimensions with last dimension ``t`` is viewed as ``(d / 2t^2, 2t^2)``; a 1-d
tensor has no sketch: the whole vector is all-reduced and its top coordinates are selected. A
protocol that sees only the flat gradient views it as one matrix of ``cols`` columns
(:func:`plan`, ``shapes`` None), the last row padded with zeros.

Bytes per worker per step (two ring all-reduces of float32):
``2 (n-1)/n 4 (sum_rows r + sum_k cols)`` (:func:`sketch_numel`, :func:`selected_numel`).

:class:`ArcTopK` is the scheme as a :class:`~squall.training.compress.SharedSupport` compression:
``squall.collectives.allreduce(..., compression=ArcTopK(...))`` runs steps 1-4 over the ring (the
sketch is :meth:`ArcTopK.sketch`, the selection :meth:`ArcTopK.support`). It has no payload of its
own: both all-reduces carry plain float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Guarantees, SharedSupport, Support
from squall.training.compress.randk import shared_seed
from squall.training.compress.topk import top_k_indices

Floats = npt.NDArray[np.float32]
RowIndex = npt.NDArray[np.int64]

#: Default columns of the matrix a flat gradient is viewed as.
DEFAULT_COLS = 256
#: Salt of the per-round shared seed of the sketch in an all-reduce.
ARC_SALT = 0x4152
#: Largest sketch rank and matrix width a configuration may ask for.
MAX_RANK = 1024
MAX_COLS = 1 << 20


@dataclass(frozen=True, slots=True)
class Segment:
    """One matrix of the flat vector: ``numel`` elements from ``offset``, viewed as ``rows x cols``.

    ``cols == 0`` marks a vector segment (a 1-d tensor): no sketch, coordinates selected from the
    all-reduced vector itself. The last row of a matrix may be padded with zeros
    (``rows * cols >= numel``).
    """

    offset: int
    numel: int
    rows: int
    cols: int

    @property
    def is_vector(self) -> bool:
        """A 1-d tensor: selected coordinate by coordinate, without a sketch."""
        return self.cols == 0


def matrix_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """The ``(rows, cols)`` the paper's hook gives a tensor of ``shape``; None for a 1-d tensor.

    2-d: itself. More dimensions, last one ``t``: ``(d / 2t^2, 2t^2)`` when that divides, else
    ``(d / t, t)`` (the hook's reshape would fail there; this is the nearest matrix it allows).
    """
    dims = [int(s) for s in shape]
    if any(s < 1 for s in dims) or not dims:
        raise ValueError(f"arc_topk: shape {tuple(dims)} must have one or more dimensions, each >= 1")
    if len(dims) == 1:
        return None
    if len(dims) == 2:
        return dims[0], dims[1]
    d, t = math.prod(dims), dims[-1]
    m = 2 * t * t
    return (d // m, m) if d % m == 0 else (d // t, t)


def plan(numel: int, *, shapes: Sequence[Sequence[int]] | None = None, cols: int = DEFAULT_COLS) -> tuple[Segment, ...]:
    """The segments of a flat vector of ``numel`` elements (see the module docstring).

    :param shapes: the tensors packed in the vector, in order (they must add up to ``numel``);
        None views the whole vector as one matrix of ``cols`` columns.
    """
    if shapes is None:
        if cols < 1:
            raise ValueError(f"arc_topk: cols must be >= 1, got {cols}")
        return (Segment(0, numel, -(-numel // cols), cols),) if numel else ()
    segments, offset = [], 0
    for shape in shapes:
        size = math.prod(int(s) for s in shape)
        matrix = matrix_shape(shape)
        segments.append(Segment(offset, size, size, 0) if matrix is None else Segment(offset, size, *matrix))
        offset += size
    if offset != numel:
        raise ValueError(f"arc_topk: shapes hold {offset} elements, the vector has {numel}")
    return tuple(segments)


def selected_rows(segment: Segment, ratio: float) -> int:
    """Rows (coordinates for a vector segment) kept: ``max(1, floor(ratio rows))``."""
    if not 0 < ratio <= 1:
        raise ValueError(f"arc_topk: ratio must be in (0, 1], got {ratio}")
    return min(segment.rows, max(1, int(ratio * segment.rows)))


def sketch_numel(segments: Sequence[Segment], rank: int) -> int:
    """Floats of the all-reduced sketch: ``rows r`` per matrix, the whole vector per vector segment."""
    return sum(s.numel if s.is_vector else s.rows * rank for s in segments)


def selected_numel(segments: Sequence[Segment], ratio: float) -> int:
    """Floats of the all-reduced selected rows: ``k cols`` per matrix, ``k`` per vector segment."""
    return sum(selected_rows(s, ratio) * max(s.cols, 1) for s in segments)


def _matrix(flat: Floats, segment: Segment) -> Floats:
    part = flat[segment.offset : segment.offset + segment.numel]
    pad = segment.rows * segment.cols - segment.numel
    if pad:
        part = np.concatenate([part, np.zeros(pad, dtype=part.dtype)])
    return part.reshape(segment.rows, segment.cols)


def sketch_matrices(segments: Sequence[Segment], rank: int, seed: int, *, exact: bool = False) -> list[Floats | None]:
    """The Gaussian ``V`` (``cols x r``) of every matrix segment, drawn in order from ``seed``.

    :param exact: the identity instead (``r = cols``), for the exact-sketch contraction check.
    """
    if rank < 1:
        raise ValueError(f"arc_topk: sketch rank must be >= 1, got {rank}")
    rng = np.random.Generator(np.random.PCG64(seed))
    out: list[Floats | None] = []
    for s in segments:
        if s.is_vector:
            out.append(None)
        elif exact:
            out.append(np.eye(s.cols, dtype=np.float32))
        else:
            out.append(rng.standard_normal((s.cols, rank), dtype=np.float32))
    return out


def local_sketch(flat: Floats, segments: Sequence[Segment], sketches: Sequence[Floats | None]) -> Floats:
    """This worker's sketch ``G_i V`` of every segment (the vector itself for vector segments), flat."""
    parts = [
        flat[s.offset : s.offset + s.numel] if v is None else (_matrix(flat, s) @ v).reshape(-1)
        for s, v in zip(segments, sketches, strict=True)
    ]
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, dtype=np.float32)


def select(mean_sketch: Floats, segments: Sequence[Segment], ratio: float, rank: int, *,
           exact: bool = False) -> list[RowIndex]:
    """Per segment, the ascending rows (coordinates) with the largest sketch norms: identical on every worker.

    :param exact: the sketch was exact (``V = I``, ``cols`` wide) rather than ``rank`` wide.
    """
    out, at = [], 0
    for s in segments:
        width = 1 if s.is_vector else (s.cols if exact else rank)
        p = mean_sketch[at : at + s.rows * width].reshape(s.rows, width)
        out.append(top_k_indices(np.einsum("ij,ij->i", p, p, dtype=np.float64), selected_rows(s, ratio)))
        at += s.rows * width
    if at != mean_sketch.size:
        raise ValueError(f"arc_topk: sketch of {mean_sketch.size} floats, the plan needs {at}")
    return out


def gather_rows(flat: Floats, segments: Sequence[Segment], selection: Sequence[RowIndex]) -> Floats:
    """The selected rows (coordinates) of every segment, packed one after another."""
    parts = [
        flat[s.offset + rows] if s.is_vector else _matrix(flat, s)[rows].reshape(-1)
        for s, rows in zip(segments, selection, strict=True)
    ]
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, dtype=np.float32)


def scatter_rows(packed: Floats, segments: Sequence[Segment], selection: Sequence[RowIndex], numel: int) -> Floats:
    """The dense vector holding ``packed``'s rows at their places, zero elsewhere (inverse of :func:`gather_rows`)."""
    out = np.zeros(numel, dtype=np.float32)
    at = 0
    for s, rows in zip(segments, selection, strict=True):
        if s.is_vector:
            out[s.offset + rows] = packed[at : at + rows.size]
            at += rows.size
            continue
        block = np.zeros((s.rows, s.cols), dtype=np.float32)
        block[rows] = packed[at : at + rows.size * s.cols].reshape(rows.size, s.cols)
        at += rows.size * s.cols
        out[s.offset : s.offset + s.numel] = block.reshape(-1)[: s.numel]
    if at != packed.size:
        raise ValueError(f"arc_topk: {packed.size} packed floats, the selection holds {at}")
    return out


def compress_mean(
    vectors: Sequence[npt.ArrayLike], segments: Sequence[Segment], *, ratio: float, rank: int, seed: int,
    exact: bool = False,
) -> tuple[Floats, list[RowIndex]]:
    """ARC-Top-K of several workers' vectors without a network: ``mean_i C(x_i)`` and the selection.

    The all-reduces are plain means here; the protocol does the same over the ring.
    """
    flats = [np.asarray(v, dtype=np.float32).reshape(-1) for v in vectors]
    sketches = sketch_matrices(segments, rank, seed, exact=exact)
    mean_sketch = np.stack([local_sketch(f, segments, sketches) for f in flats]).astype(np.float64).mean(axis=0)
    selection = select(mean_sketch.astype(np.float32), segments, ratio, rank, exact=exact)
    packed = np.stack([gather_rows(f, segments, selection) for f in flats]).astype(np.float64).mean(axis=0)
    return scatter_rows(packed.astype(np.float32), segments, selection, flats[0].size), selection


def contraction_ratio(compressed: npt.ArrayLike, exact: npt.ArrayLike) -> float:
    """``||C(G) - G||^2 / ||G||^2`` for the aggregate ``G`` and its compression (0 for ``G = 0``)."""
    g = np.asarray(exact, dtype=np.float64)
    norm = float(g @ g)
    diff = np.asarray(compressed, dtype=np.float64) - g
    return float(diff @ diff) / norm if norm else 0.0


class SelectedRows(Support):
    """The rows (coordinates, for vector segments) every rank selected from the mean sketch."""

    def __init__(self, segments: Sequence[Segment], selection: Sequence[RowIndex]) -> None:
        self.segments, self.selection = tuple(segments), list(selection)

    def gather(self, x: Floats) -> Floats:
        """The selected rows of ``x``, packed (:func:`gather_rows`)."""
        return gather_rows(x, self.segments, self.selection)

    def scatter(self, values: Floats, numel: int) -> Floats:
        """Packed rows back at their places (:func:`scatter_rows`)."""
        return scatter_rows(values, self.segments, self.selection, numel)


class ArcTopK(SharedSupport):
    """ARC-Top-K as an all-reduce compression (see the module docstring).

    :param ratio: fraction of rows selected per matrix, in (0, 1].
    :param rank: sketch rank ``r``.
    :param cols: columns of the one matrix a vector is viewed as when ``shapes`` is None.
    :param shapes: the tensors packed in the vector, in order (:func:`plan`); None: one matrix.
    :param seed: the run's shared seed; every round draws its sketch from ``shared_seed(seed, round)``.
    """

    name: ClassVar[str] = "arc_top_k"
    sketched: ClassVar[bool] = True

    def __init__(self, *, ratio: float = 0.05, rank: int = 4, cols: int = DEFAULT_COLS,
                 shapes: Sequence[Sequence[int]] | None = None, seed: int = 0) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"arc_topk: ratio = {ratio} must be in (0, 1]")
        if not 1 <= rank <= MAX_RANK:
            raise ValueError(f"arc_topk: rank = {rank} must be in [1, {MAX_RANK}]")
        if not 1 <= cols <= MAX_COLS:
            raise ValueError(f"arc_topk: cols = {cols} must be in [1, 2**20]")
        if not 0 <= seed < 1 << 32:
            raise ValueError(f"arc_topk: seed = {seed} must be in [0, 2**32)")
        self.ratio, self.rank, self.cols, self.seed = ratio, rank, cols, seed
        self.shapes = None if shapes is None else tuple(tuple(int(d) for d in s) for s in shapes)
        self._plans: dict[int, tuple[Segment, ...]] = {}

    @property
    def guarantees(self) -> Guarantees:
        """Biased; with an exact sketch it contracts the aggregate by ``1 - k/rows``, a rank-``r`` one about so."""
        return Guarantees(
            unbiased=False,
            contractive=False,  # on the aggregate, and only approximately with a rank-r sketch
            delta=None,
            error_bound="||C(G) - G||^2 <= (1 - k/rows) ||G||^2 for the aggregate G with an exact sketch; "
            "approximately so (Johnson-Lindenstrauss) with a rank-r one",
        )

    def plan(self, numel: int) -> tuple[Segment, ...]:
        """The segments of a vector of ``numel`` elements (:func:`plan`), made once per size."""
        segments = self._plans.get(numel)
        if segments is None:
            segments = self._plans[numel] = plan(numel, shapes=self.shapes, cols=self.cols)
        return segments

    def sketch(self, x: Floats, round: int) -> Floats:
        """``G_i V`` of every matrix (the vector itself for vector segments), ``V`` from the round's seed."""
        segments = self.plan(x.size)
        sketches = sketch_matrices(segments, self.rank, shared_seed(self.seed, round, ARC_SALT))
        return local_sketch(x, segments, sketches)

    def sketch_numel(self, numel: int) -> int:
        """``rows r`` per matrix, the whole vector per vector segment."""
        return sketch_numel(self.plan(numel), self.rank)

    def support(self, numel: int, round: int, mean_sketch: Floats | None) -> SelectedRows:
        """The top rows of every matrix by the mean sketch's row norms: the same on every rank."""
        if mean_sketch is None:
            raise ValueError("arc_topk: the selection needs the mean sketch")
        segments = self.plan(numel)
        return SelectedRows(segments, select(mean_sketch, segments, self.ratio, self.rank))

    def support_numel(self, numel: int) -> int:
        """``k cols`` per matrix, ``k`` per vector segment."""
        return selected_numel(self.plan(numel), self.ratio)
