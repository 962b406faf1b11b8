"""Configurable bounds checked before the decoder allocates anything.

A peer that claims a 2**40-byte payload, a 200-dimensional tensor or a million chunks is
rejected from the fixed-size header alone, so hostile or corrupted input costs a few hundred
bytes of work, never the amount it claims.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The descriptor has room for at most this many dimensions, whatever the limits say.
HARD_MAX_NDIM = 32


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Upper bounds on what one message may claim.

    :param max_message_bytes: payload bytes of one message (frame minus its fixed header).
    :param max_ndim: dimensions of one tensor (0-d tensors are always allowed).
    :param max_control_bytes: encoded size of one control object (UTF-8 JSON).
    :param max_control_depth: nesting depth of lists/objects inside a control object.
    :param max_chunk_count: chunks one tensor may be split into.
    """

    max_message_bytes: int = 1 << 30  # 1 GiB: the largest tensor payload we accept
    max_ndim: int = 8  # torch models rarely need more; the format caps it at HARD_MAX_NDIM
    max_control_bytes: int = 64 << 10  # control objects are small by design
    max_control_depth: int = 16  # JSON nesting; stops recursion bombs before json.loads
    max_chunk_count: int = 1 << 24  # 16 Mi chunks of 64 B still cover a 1 GiB tensor

    def __post_init__(self) -> None:
        if not 0 < self.max_message_bytes < 1 << 63:
            raise ValueError(f"max_message_bytes must be in (0, 2**63), got {self.max_message_bytes}")
        if not 0 <= self.max_ndim <= HARD_MAX_NDIM:
            raise ValueError(f"max_ndim must be in [0, {HARD_MAX_NDIM}], got {self.max_ndim}")
        if not 2 <= self.max_control_bytes < 1 << 32:
            raise ValueError(f"max_control_bytes must be in [2, 2**32), got {self.max_control_bytes}")
        if self.max_control_depth < 1:
            raise ValueError(f"max_control_depth must be >= 1, got {self.max_control_depth}")
        if not 1 <= self.max_chunk_count < 1 << 32:
            raise ValueError(f"max_chunk_count must be in [1, 2**32), got {self.max_chunk_count}")


DEFAULT_LIMITS = WireLimits()
