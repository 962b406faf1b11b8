"""Streaming DiLoCo's fragments (which parameters each one holds) and schedule (which one syncs when). Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

PATTERNS: Final = ("strided", "sequential")
_BLOCK = re.compile(r"^h(\d+)\.")

#: ``[start, stop)`` ranges of the flat parameter vector.
Ranges = tuple[tuple[int, int], ...]


def tensor_ranges(shapes: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """The ``[start, stop)`` range of each tensor packed one after another."""
    out, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append((offset, offset + size))
        offset += size
    return out


def _merge(ranges: Sequence[tuple[int, int]]) -> Ranges:
    """Sorted ranges with touching neighbours joined."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return tuple(merged)


def by_blocks(names: Sequence[str], shapes: Sequence[Sequence[int]], fragments: int,
              pattern: str = "strided") -> tuple[Ranges, ...] | None:
    """The fragments of a model whose blocks are named ``h<i>.*``; None when it names no blocks.

    Block ``b`` of ``L`` goes to fragment ``b mod F`` (strided) or ``b * F // L`` (sequential);
    tensors before the first block go to fragment 0, those after the last to fragment ``F - 1``.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if len(names) != len(shapes):
        raise ValueError(f"{len(names)} names for {len(shapes)} tensors")
    blocks = [int(m.group(1)) if (m := _BLOCK.match(name)) else None for name in names]
    found = sorted({b for b in blocks if b is not None})
    if not found:
        return None
    if len(found) < fragments:
        raise ValueError(f"{fragments} fragments need at least as many blocks, the model has {len(found)}")
    rank = {b: i for i, b in enumerate(found)}
    seen_block = False
    owner = []
    for block in blocks:
        if block is None:
            owner.append(fragments - 1 if seen_block else 0)
            continue
        seen_block = True
        i = rank[block]
        owner.append(i % fragments if pattern == "strided" else i * fragments // len(found))
    ranges = tensor_ranges(shapes)
    return tuple(_merge([r for r, o in zip(ranges, owner, strict=True) if o == p]) for p in range(fragments))


def contiguous(numel: int, fragments: int) -> tuple[Ranges, ...]:
    """``numel`` parameters cut into ``fragments`` contiguous, nearly equal ranges."""
    if fragments > max(numel, 1):
        raise ValueError(f"cannot cut {numel} parameters into {fragments} fragments")
    bounds = [numel * p // fragments for p in range(fragments + 1)]
    return tuple(((bounds[p], bounds[p + 1]),) for p in range(fragments))


def check_schedule(sync_every: int, fragments: int, overlap: int) -> None:
    """``H`` a multiple of ``F`` and ``0 <= tau < H/F`` (one fragment in flight at a time), else ValueError."""
    if fragments < 1 or sync_every < 1:
        raise ValueError(f"sync_every and fragments must be >= 1, got {sync_every} and {fragments}")
    if sync_every % fragments:
        raise ValueError(f"sync_every {sync_every} must be a multiple of fragments {fragments}")
    if not 0 <= overlap < sync_every // fragments:
        raise ValueError(f"overlap must be in [0, sync_every/fragments) = [0, {sync_every // fragments}), "
                         f"got {overlap}: a fragment's average must arrive before the next fragment is sent")


def syncing(done: int, sync_every: int, fragments: int) -> int | None:
    """The fragment sent after ``done`` inner steps (None: none): fragment ``p`` at ``t_p + H, t_p + 2H ...``
    with ``t_p = p H/F``."""
    period = sync_every // fragments
    if done < sync_every or done % period:
        return None
    return (done // period) % fragments
