"""Seeded partition of a data set's samples among ranks: IID, by label, or Dirichlet over labels.

Every rank computes the same partition from the same global seed and keeps its own part, so the
parts are disjoint and together cover the data set without any communication.

* ``iid``: a seeded permutation cut into ``world`` nearly equal parts.
* ``label``: the pathological non-IID split of McMahan et al. (2017): samples sorted by label
  (ties in seeded random order), cut into ``world * shards_per_rank`` contiguous pieces, and each
  rank given ``shards_per_rank`` pieces chosen at random. With few pieces per rank a rank sees
  only a few labels; parts have equal sizes (to within one sample per piece).
* ``dirichlet``: for every label, proportions ``p ~ Dirichlet(alpha, ..., alpha)`` over the ranks
  decide how that label's samples are split. Small ``alpha`` (0.1) is very skewed, large ``alpha``
  (100) is close to IID. Part sizes differ; draws are repeated until every rank has at least
  ``min_size`` samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IndexArray = npt.NDArray[np.int64]

KINDS = ("iid", "label", "dirichlet")
MAX_DIRICHLET_DRAWS = 1000


def derive_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed mixed from ``seed`` and ``parts`` (e.g. rank, purpose), stable across platforms."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, *(p & 0xFFFFFFFF for p in parts)])
    return int(state.generate_state(1, dtype=np.uint64)[0]) >> 1


@dataclass(frozen=True)
class Sharding:
    """How samples are split among ranks (see the module docstring)."""

    kind: str = "iid"  # "iid", "label" or "dirichlet"
    alpha: float = 0.5  # dirichlet: concentration; smaller is more skewed
    shards_per_rank: int = 2  # label: label-sorted pieces per rank
    min_size: int = 1  # dirichlet: every rank gets at least this many samples

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"sharding kind must be one of {KINDS}, got {self.kind!r}")
        if not self.alpha > 0:
            raise ValueError(f"dirichlet alpha must be > 0, got {self.alpha}")
        if self.shards_per_rank < 1:
            raise ValueError(f"shards_per_rank must be >= 1, got {self.shards_per_rank}")
        if self.min_size < 0:
            raise ValueError(f"min_size must be >= 0, got {self.min_size}")

    @classmethod
    def parse(cls, obj: str | Mapping[str, Any] | Sharding | None) -> Sharding:
        """From ``"iid"``, ``"label"``, ``"dirichlet"``, ``"dirichlet:0.1"`` or ``{"kind": ..., ...}``."""
        if obj is None:
            return cls()
        if isinstance(obj, Sharding):
            return obj
        if isinstance(obj, str):
            kind, _, alpha = obj.partition(":")
            return cls(kind=kind, alpha=float(alpha)) if alpha else cls(kind=kind)
        unknown = sorted(set(obj) - {"kind", "alpha", "shards_per_rank", "min_size"})
        if unknown:
            raise ValueError(f"sharding has unknown keys {unknown}")
        return cls(
            kind=str(obj.get("kind", "iid")),
            alpha=float(obj.get("alpha", 0.5)),
            shards_per_rank=int(obj.get("shards_per_rank", 2)),
            min_size=int(obj.get("min_size", 1)),
        )


def all_shards(labels: npt.ArrayLike, *, world: int, seed: int, sharding: Sharding) -> list[IndexArray]:
    """The sample indices of every rank; disjoint, covering ``range(len(labels))``."""
    y = np.asarray(labels).reshape(-1)
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if len(y) < world:
        raise ValueError(f"cannot split {len(y)} samples among {world} ranks")
    rng = np.random.default_rng(derive_seed(seed, 0x5A4D))
    if sharding.kind == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(y)), world)]
    if sharding.kind == "label":
        return _by_label(y, world, sharding.shards_per_rank, rng)
    return _dirichlet(y, world, sharding.alpha, sharding.min_size, rng)


def shard_indices(labels: npt.ArrayLike, *, rank: int, world: int, seed: int, sharding: Sharding) -> IndexArray:
    """The sample indices of ``rank`` (sorted)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} not in range({world})")
    return all_shards(labels, world=world, seed=seed, sharding=sharding)[rank]


def _by_label(y: npt.NDArray[Any], world: int, per_rank: int, rng: np.random.Generator) -> list[IndexArray]:
    pieces_count = world * per_rank
    if len(y) < pieces_count:
        raise ValueError(f"cannot cut {len(y)} samples into {pieces_count} label pieces")
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(order, pieces_count)
    owner = rng.permutation(pieces_count)
    return [
        np.sort(np.concatenate([pieces[j] for j in owner[r * per_rank : (r + 1) * per_rank]])) for r in range(world)
    ]


def _dirichlet(
    y: npt.NDArray[Any], world: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[IndexArray]:
    classes = np.unique(y)
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts: list[list[IndexArray]] = [[] for _ in range(world)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(world, alpha))) * len(members)).astype(np.int64)[:-1]
            for r, piece in enumerate(np.split(members, cuts)):
                parts[r].append(piece)
        shards = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(s) for s in shards) >= min_size:
            return shards
    raise ValueError(
        f"no Dirichlet({alpha}) split of {len(y)} samples gives every one of {world} ranks "
        f"{min_size} samples in {MAX_DIRICHLET_DRAWS} draws; raise alpha or lower min_size"
    )
