"""DeMo's (index, value) pairs on the wire: a validated compressed payload, ``demo_dct``.

Payload: parameters ``k`` (the most coefficients any chunk keeps) and ``tile`` (the largest chunk, in
elements); arrays ``indices`` (int32, each in ``[0, tile)``) and ``values`` (float32, finite), both
``numel`` long, where ``numel`` is the number of pairs. The receiver then checks every index
against its own chunk's size (:func:`check_indices`): the chunks' sizes differ from tensor to
tensor, and both sides know the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import torch

from squall.protocols.demo.dct import Plan
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

NAME: Final = "demo_dct"
MAX_TILE: Final = 1 << 24


def _check_params(numel: int, params: Params) -> None:
    if not 1 <= params["tile"] <= MAX_TILE:
        raise WireError(f"{NAME}: tile must be in [1, {MAX_TILE}], got {params['tile']}")
    if not 1 <= params["k"] <= params["tile"]:
        raise WireError(f"{NAME}: k must be in [1, tile = {params['tile']}], got {params['k']}")


def _check(payload: CompressedPayload) -> None:
    if not np.isfinite(payload.arrays["values"]).all():
        raise WireError(f"{NAME}: a value is not finite")


SCHEMA: Final = PayloadSchema(
    compressor=NAME,
    params=(("k", ParamKind.U64), ("tile", ParamKind.U64)),
    arrays=(
        ArraySpec("indices", np.dtype(np.int32), count=lambda numel, p: numel, bound=lambda numel, p: int(p["tile"])),
        ArraySpec("values", np.dtype(np.float32), count=lambda numel, p: numel),
    ),
    check_params=_check_params,
    check=_check,
)


def payload_of(index: torch.Tensor, values: torch.Tensor, *, k: int, tile: int) -> CompressedPayload:
    """The payload of every tensor's pairs, concatenated in tensor order."""
    return CompressedPayload(NAME, int(index.numel()), {"k": k, "tile": tile},
                             {"indices": index.to(torch.int32).numpy(), "values": values.to(torch.float32).numpy()})


def payload_bytes(entries: int) -> int:
    """Bytes of a payload of ``entries`` pairs."""
    return wire_size(SCHEMA, [entries, entries])


def chunk_limits(plans: Sequence[Plan]) -> np.ndarray:
    """Every pair's chunk size, in payload order (what :func:`check_indices` compares with)."""
    return np.concatenate([np.full(p.entries, p.tile, dtype=np.int64) for p in plans])


def check_indices(payload: CompressedPayload, limits: np.ndarray, *, sender: int) -> None:
    """Raise ValueError naming ``sender`` when an index is outside its chunk."""
    index = np.asarray(payload.arrays["indices"], dtype=np.int64)
    bad = np.flatnonzero(index >= limits)
    if bad.size:
        raise ValueError(f"rank {sender} sent {bad.size} DeMo indices outside their chunk (first at pair {bad[0]})")
