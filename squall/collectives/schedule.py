"""Pure schedules of the all-reduce collectives: who sends which element range to whom, step by step.

Nothing here touches a tensor or a socket; :mod:`~squall.collectives.ring` and
:mod:`~squall.collectives.butterfly` drive these schedules over a transport. Every rank
computes the same schedule from ``(numel, world_size, chunk elements)`` alone, so ranks agree on
how many messages of which size will flow without exchanging any metadata. Ranges are
half-open ``(start, stop)`` element offsets into the flattened tensor; an empty range means
"no message at all" on both ends.

Ring (reduce-scatter, then all-gather). The vector is cut into ``n`` near-equal segments
(:func:`split_bounds`). At step ``k`` of ``2(n-1)`` rank ``r`` sends one segment to ``r+1`` and
receives one from ``r-1``:

* reduce-scatter, ``k = 0..n-2``: send segment ``(r-k) mod n``, receive ``(r-k-1) mod n`` and
  reduce it into the local copy; after step ``n-2`` rank ``r`` holds the complete reduction of
  segment ``(r+1) mod n`` (it has passed through all ``n`` ranks exactly once);
* all-gather, ``k = n-1+j, j = 0..n-2``: send segment ``(r+1-j) mod n``, receive ``(r-j) mod n``
  and overwrite the local copy with it.

In both phases the segment received at step ``k`` is the one sent at step ``k+1``, which is what
lets the ring pipeline chunk by chunk: chunk ``c`` of step ``k+1`` leaves as soon as chunk ``c``
of step ``k`` has arrived and been reduced.

Rabenseifner (recursive halving, then recursive doubling) on ``p = 2^m`` ranks, blocks
``0..p-1``. Before the halving step at distance ``d`` (``d = p/2, p/4, ..., 1``) rank ``r`` is
responsible for the ``2d`` aligned blocks ``[r - r mod 2d, r - r mod 2d + 2d)``; it keeps the half
that contains block ``r`` and sends the other half to ``r XOR d``, whose kept half it receives
and reduces. After ``m`` steps rank ``r`` owns block ``r``, fully reduced. The all-gather
replays the steps backwards (``d = 1, 2, ..., p/2``), each rank sending everything it holds to
``r XOR d`` and receiving the partner's equally large aligned range.

Folding (any ``n``). With ``p`` the largest power of two ``<= n``, the ``n - p`` "extra" ranks
``e = p..n-1`` send their vector to rank ``e - p`` before the core algorithm, take no part in
it, and receive the result from ``e - p`` at the end. See :class:`FoldPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass


def split_bounds(total: int, parts: int) -> tuple[int, ...]:
    """Boundaries ``0 = b_0 <= b_1 <= ... <= b_parts = total`` of ``parts`` contiguous blocks.

    Block ``i`` is ``[b_i, b_(i+1))``; the first ``total mod parts`` blocks hold one element more
    than the others, so sizes differ by at most one and a vector shorter than ``parts`` gives
    some empty blocks.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    base, extra = divmod(total, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return tuple(bounds)


def chunk_elements(chunk_bytes: int, itemsize: int) -> int:
    """Elements per pipelined chunk: ``chunk_bytes // itemsize``, at least one."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    if itemsize < 1:
        raise ValueError(f"itemsize must be >= 1, got {itemsize}")
    return max(1, chunk_bytes // itemsize)


#: Bounds of the ring's automatic chunk size (see :func:`ring_chunk_bytes`).
MIN_RING_CHUNK = 1 << 20
MAX_RING_CHUNK = 4 << 20
#: Chunks per segment the automatic size aims at, between the bounds.
RING_CHUNKS_PER_SEGMENT = 4


def ring_chunk_bytes(nbytes: int, world_size: int) -> int:
    """The ring's chunk size when none is given: a quarter segment, between 1 MiB and 4 MiB.

    Every rank computes it from the vector's size alone, so all agree. With ``c`` chunks per
    segment a step lasts about ``max(alpha + S/(c n B), S/(nB))`` instead of ``alpha + S/(nB)``:
    the next step starts once the first chunk of this one has arrived, so the latency of each step,
    and the reduction of each chunk, hide behind the transfer of the rest. But every message
    costs tens of microseconds of Python on both ends, plus the event-loop wake-ups that come
    with it, and where ranks share cores that CPU time sets the pace: small chunks (64 KiB) cost
    more than they hide, a whole segment as one chunk leaves the link idle while it is reduced and
    handed on, and too many chunks per segment at large sizes cost more CPU than they hide
    (benchmarks/README.md). Hence: 1 MiB for vectors up to ``4n`` MiB (one chunk per step below
    ``n`` MiB, where latency rules and splitting gains nothing), and about four chunks per segment
    above, up to 4 MiB each.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    segment = -(-max(nbytes, 0) // world_size)
    return min(MAX_RING_CHUNK, max(MIN_RING_CHUNK, -(-segment // RING_CHUNKS_PER_SEGMENT)))


def chunk_ranges(start: int, stop: int, chunk: int) -> tuple[tuple[int, int], ...]:
    """``[start, stop)`` cut into consecutive ranges of ``chunk`` elements (the last may be shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return tuple((a, min(a + chunk, stop)) for a in range(start, stop, chunk))


# -- ring ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RingStep:
    """One step of the ring for one rank."""

    index: int  # 0 .. 2(n-1)-1
    send_segment: int  # segment sent to rank + 1
    recv_segment: int  # segment received from rank - 1
    reduce: bool  # True in the reduce-scatter phase (reduce into the local copy), False: overwrite


def ring_steps(rank: int, world_size: int) -> tuple[RingStep, ...]:
    """The ``2(n-1)`` steps of rank ``rank`` (see the module docstring); empty for ``n = 1``."""
    n = world_size
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} not in range({n})")
    steps = [RingStep(k, (rank - k) % n, (rank - k - 1) % n, True) for k in range(n - 1)]
    steps += [RingStep(n - 1 + j, (rank + 1 - j) % n, (rank - j) % n, False) for j in range(n - 1)]
    return tuple(steps)


def ring_owner(segment: int, world_size: int) -> int:
    """The rank that completes the reduction of ``segment`` (at the last reduce-scatter step)."""
    return (segment - 1) % world_size


# -- butterfly -----------------------------------------------------------------------------------


def largest_power_of_two(n: int) -> int:
    """The largest ``2^m <= n`` (``n >= 1``)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True, slots=True)
class FoldPlan:
    """How ``world_size`` ranks fold onto the ``core`` = largest power of two below or equal to it.

    Ranks ``0..core-1`` run the power-of-two algorithm. Each extra rank ``e >= core`` is paired
    with ``e - core``: it sends its whole vector there first (one message of ``S`` bytes), which
    reduces it into its own, and gets the finished result back at the end (another ``S``). An
    extra rank therefore costs its partner ``2(alpha + S/B)``; ranks without an extra partner
    wait for those two steps only through the partners they exchange with.
    """

    world_size: int  # all ranks
    core: int  # largest power of two <= world_size

    @classmethod
    def of(cls, world_size: int) -> FoldPlan:
        """The folding of ``world_size`` ranks."""
        return cls(world_size, largest_power_of_two(world_size))

    def is_extra(self, rank: int) -> bool:
        """True for ranks that sit out the core algorithm."""
        return rank >= self.core

    def partner(self, rank: int) -> int | None:
        """The core rank an extra rank folds onto, the extra rank a core rank absorbs, or None."""
        if self.is_extra(rank):
            return rank - self.core
        extra = rank + self.core
        return extra if extra < self.world_size else None


@dataclass(frozen=True, slots=True)
class ButterflyStep:
    """One step of recursive halving or doubling for one core rank; ranges are block indices."""

    partner: int  # rank XOR distance
    send_blocks: tuple[int, int]  # blocks sent to the partner
    recv_blocks: tuple[int, int]  # blocks received from the partner


def _check_core(rank: int, core: int) -> int:
    if core < 1 or core & (core - 1):
        raise ValueError(f"core size must be a power of two, got {core}")
    if not 0 <= rank < core:
        raise ValueError(f"rank {rank} not in range({core})")
    return core.bit_length() - 1


def halving_steps(rank: int, core: int) -> tuple[ButterflyStep, ...]:
    """Recursive-halving reduce-scatter: distances ``core/2 .. 1``; the received blocks are reduced."""
    steps = []
    for level in reversed(range(_check_core(rank, core))):
        d = 1 << level
        base = rank - rank % (2 * d)
        lower, upper = (base, base + d), (base + d, base + 2 * d)
        keep, give = (upper, lower) if rank & d else (lower, upper)
        steps.append(ButterflyStep(rank ^ d, give, keep))
    return tuple(steps)


def doubling_gather_steps(rank: int, core: int) -> tuple[ButterflyStep, ...]:
    """Recursive-doubling all-gather: distances ``1 .. core/2``; the received blocks are copied."""
    steps = []
    for level in range(_check_core(rank, core)):
        d = 1 << level
        mine = (rank - rank % d, rank - rank % d + d)
        theirs_start = (rank ^ d) - (rank ^ d) % d
        steps.append(ButterflyStep(rank ^ d, mine, (theirs_start, theirs_start + d)))
    return tuple(steps)


def doubling_partners(rank: int, core: int) -> tuple[int, ...]:
    """Partners of whole-vector recursive doubling: ``rank XOR 2^k`` for ``k = 0 .. log2(core)-1``."""
    return tuple(rank ^ (1 << level) for level in range(_check_core(rank, core)))


def block_range(bounds: tuple[int, ...], blocks: tuple[int, int]) -> tuple[int, int]:
    """Element range covered by the block range ``[first, stop)`` given block ``bounds``."""
    return bounds[blocks[0]], bounds[blocks[1]]
