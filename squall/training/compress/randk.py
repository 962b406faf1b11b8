"""Rand-K sparsification with a shared seed: ``k`` random coordinates, scaled by ``d/k``, no indices sent.

Every worker draws the same ``k`` coordinates out of ``d`` from a seed they share (a run seed and
the step: :func:`shared_indices`), so the payload is the ``k`` values alone and the workers can
add their payloads coordinate by coordinate (an index-free all-reduce). Scaling by ``d/k`` makes
the compressor unbiased, ``E[C(x)] = x`` over the draw, with variance
``E||C(x) - x||^2 = (d/k - 1) ||x||^2``: cheap and unbiased, but it ignores where the gradient's
mass is (ARC-Top-K's paper: it "discards structural information"). With ``unbiased`` off the
coordinates are not scaled: the form error feedback is analysed for (contractive in expectation,
``E||C(x) - x||^2 = (1 - k/d) ||x||^2``).

In an all-reduce (:func:`squall.collectives.allreduce`) Rand-K is a :class:`SharedSupport`: every
rank draws the round's coordinates from ``shared_seed(seed, round)``, so the ``k`` values of all
ranks line up and are ring-all-reduced without indices, then scattered back (and scaled).

Payload (point-to-point use): parameters ``k`` and ``seed``; array ``values`` (float32, ``k``, the
unscaled coordinates). The receiver redraws the indices from the seed and checks ``k <= numel``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Floats, Guarantees, Indices, SharedSupport, Support
from squall.training.compress.topk import check_expansion, count_for
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

#: Seeds are unsigned 64-bit integers on the wire.
SEED_BOUND = 1 << 64
#: Salt of the per-round shared seed of Rand-K's coordinates in an all-reduce.
RANDK_SALT = 0x524E


def shared_seed(seed: int, step: int, salt: int = 0) -> int:
    """A 64-bit seed every worker derives alike from the run's ``seed``, the ``step`` and a ``salt``."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, step & 0xFFFFFFFF, salt & 0xFFFFFFFF])
    return int(state.generate_state(2, dtype=np.uint32).view(np.uint64)[0])


def shared_indices(numel: int, k: int, seed: int) -> npt.NDArray[np.int64]:
    """The ``k`` distinct coordinates, ascending, that ``seed`` picks out of ``numel`` (the same everywhere)."""
    if not 0 <= k <= numel:
        raise ValueError(f"randk: cannot pick {k} of {numel} coordinates")
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.sort(rng.choice(numel, size=k, replace=False)).astype(np.int64)


def _check_params(numel: int, params: Params) -> None:
    if not 0 <= params["k"] <= numel:
        raise WireError(f"randk: k = {params['k']} coordinates of a {numel}-element vector; allowed 0..{numel}")
    check_expansion("rand_k", numel, int(params["k"]))


SCHEMA = PayloadSchema(
    compressor="rand_k",
    params=(("k", ParamKind.U64), ("seed", ParamKind.U64)),
    arrays=(ArraySpec("values", np.dtype(np.float32), count=lambda numel, p: int(p["k"])),),
    check_params=_check_params,
)


class Coordinates(Support):
    """Coordinates ``idx`` of every rank, their values scaled by ``scale`` when scattered back."""

    def __init__(self, idx: npt.NDArray[np.int64], scale: float) -> None:
        self.idx, self.scale = idx, np.float32(scale)

    def gather(self, x: Floats) -> Floats:
        """``x[idx]``, contiguous."""
        return np.ascontiguousarray(x[self.idx])

    def scatter(self, values: Floats, numel: int) -> Floats:
        """Zeros, with ``scale x values`` at ``idx``."""
        out = np.zeros(numel, dtype=np.float32)
        out[self.idx] = values * self.scale
        return out


class RandK(Compressor, SharedSupport):
    """``k = ratio * numel`` shared random coordinates, unbiased by ``d/k`` (see the module docstring).

    :param ratio: fraction of coordinates kept, in (0, 1].
    :param seed: the shared seed of the next :meth:`encode` (a protocol sets it per step); in an
        all-reduce, the run's seed, from which every round draws its own (:meth:`support`).
    :param k: coordinates kept (over ``ratio``).
    :param unbiased: scale the kept coordinates by ``d/k`` when decoding (a payload does not say:
        its receiver decodes it scaled).
    """

    name: ClassVar[str] = "rand_k"
    schema: ClassVar[PayloadSchema] = SCHEMA
    summable: ClassVar[bool] = True
    indices: ClassVar[Indices] = "shared"

    def __init__(self, *, ratio: float = 0.01, seed: int = 0, k: int | None = None, unbiased: bool = True) -> None:
        count_for(1, ratio)  # validates the ratio
        if not 0 <= seed < SEED_BOUND:
            raise ValueError(f"randk: seed must be in [0, 2**64), got {seed}")
        if k is not None and k < 0:
            raise ValueError(f"randk: k must be >= 0, got {k}")
        self.ratio, self.seed, self.k, self.unbiased = ratio, seed, k, unbiased

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> RandK:
        """A Rand-K with the payload's ``k`` and seed."""
        return cls(k=int(payload.params["k"]), seed=int(payload.params["seed"]))

    def count(self, numel: int) -> int:
        """Coordinates a vector of ``numel`` elements keeps."""
        return min(self.k, numel) if self.k is not None else count_for(numel, self.ratio)

    def scale(self, numel: int, k: int) -> float:
        """The factor kept coordinates are multiplied by when decoded: ``d/k`` when unbiased, else 1."""
        return numel / k if self.unbiased and k else 1.0

    @property
    def guarantees(self) -> Guarantees:
        """Unbiased over the draw when scaled; not contractive for every ``x`` either way."""
        if self.unbiased:
            return Guarantees(
                unbiased=True,
                contractive=False,  # its variance factor d/k - 1 exceeds 1 for k < d/2
                delta=None,
                error_bound="E||x - x'||^2 = (d/k - 1) ||x||^2; |x - x'| <= (d/k - 1) max|x| per coordinate",
            )
        return Guarantees(
            unbiased=False,
            contractive=False,  # only in expectation: E||x - x'||^2 = (1 - k/d) ||x||^2
            delta=None,
            error_bound="E||x - x'||^2 = (1 - k/d) ||x||^2; |x - x'| <= max|x| per coordinate",
        )

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """The (unscaled) coordinates of the 1-d ``x`` that the seed picks."""
        flat = np.asarray(x).reshape(-1)
        if not np.isfinite(flat).all():
            raise ValueError("randk: vector is not finite")
        k = self.count(flat.size)
        with np.errstate(over="ignore"):
            values = flat[shared_indices(flat.size, k, self.seed)].astype(np.float32)
        if not np.isfinite(values).all():
            raise ValueError("randk: a kept value is beyond float32's range")
        return CompressedPayload(self.name, int(flat.size), {"k": k, "seed": self.seed}, {"values": values})

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """The values at the seed's coordinates, times ``d/k`` when unbiased; zero elsewhere."""
        self._own(payload)
        numel, k = payload.numel, int(payload.params["k"])
        out = np.zeros(numel, dtype=np.float32)
        if k:
            idx = shared_indices(numel, k, int(payload.params["seed"]))
            out[idx] = np.asarray(payload.arrays["values"], dtype=np.float32) * np.float32(self.scale(numel, k))
        return Decoded(values=out, ok=True)

    def wire_bytes(self, numel: int) -> int:
        """Header, ``k`` and the seed, and ``4 k`` bytes of values."""
        return wire_size(self.schema, [self.count(numel)])

    def error_bound(self, payload: CompressedPayload) -> float:
        """Without the dropped coordinates nothing bounds them: ``inf`` unless every coordinate was sent."""
        return 0.0 if int(payload.params["k"]) == payload.numel else float("inf")

    def support(self, numel: int, round: int, mean_sketch: Floats | None) -> Coordinates:
        """The round's ``k`` coordinates, drawn from ``shared_seed(seed, round)`` (no sketch needed)."""
        k = self.count(numel)
        return Coordinates(shared_indices(numel, k, shared_seed(self.seed, round, RANDK_SALT)), self.scale(numel, k))

    def support_numel(self, numel: int) -> int:
        """``k``."""
        return self.count(numel)
