"""One group's butterfly all-reduce over a :class:`~squall.transport.rejoinable.PeerNet`, tolerant of failures.

Given the group the leader announced (:class:`~squall.protocols.moshpit.messages.GroupInfo`), member
``i`` runs three things at once (the maths is in :mod:`.partition`):

* **scatter**: send its copy of shard ``j`` to member ``j``, for every ``j != i``, in parts of at
  most ``part_bytes``;
* **reduce** (as owner of shard ``i``): take every other member's copy of shard ``i``; a copy not
  complete ``sender_timeout_s`` after the start is *excluded*; average the complete copies and its
  own with the announced weights; send the mean back to each contributor and an ``EXCLUDED``
  notice to the others;
* **gather**: take the mean of every shard ``j`` from its owner; an owner that sent nothing
  usable ``reducer_timeout_s`` after the start has *failed*, and the member keeps its own values
  for that shard (so does a member told it was excluded).

Copies carry the group id as tag, means and notices the group id with :data:`~.messages.MEAN_BIT` set,
and all carry the round, so pieces of another group or a
round cut short never mix in. Each transfer is bounded by the deadlines; nothing waits forever.
Subclasses may override :meth:`GroupAllReduce.scatter` and :meth:`GroupAllReduce.reduce` to
inject faults in tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass

import torch

from squall.protocols.moshpit.messages import GroupInfo, excluded
from squall.protocols.moshpit.partition import Bounds, blend_into, shard_bounds, weighted_mean
from squall.transport import TransportError
from squall.transport.rejoinable import PeerNet
from squall.wire import Message

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AllReduceConfig:
    """Sizes and deadlines of one group all-reduce."""

    part_bytes: int = 1 << 19  # largest tensor message: an owner reduces one part while the next travels
    sender_timeout_s: float = 5.0  # a copy of my shard not complete by then is excluded
    reducer_timeout_s: float = 10.0  # an owner that has not answered by then has failed
    alpha: float = 1.0  # averaging rate: x <- x + alpha (avg - x)

    def __post_init__(self) -> None:
        if self.part_bytes < 8:
            raise ValueError(f"part_bytes must be >= 8, got {self.part_bytes}")
        if not 0 < self.sender_timeout_s < self.reducer_timeout_s:
            raise ValueError(
                "need 0 < sender_timeout_s < reducer_timeout_s: an owner may wait for a late sender "
                f"before it answers, got {self.sender_timeout_s} and {self.reducer_timeout_s}"
            )
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")


@dataclass(frozen=True)
class AllReduceOutcome:
    """What one member got out of the all-reduce."""

    x: torch.Tensor  # the new flat vector
    contributors: tuple[int, ...]  # ranks averaged into my shard (me included)
    excluded: tuple[int, ...]  # ranks whose copy of my shard was excluded
    failed_owners: tuple[int, ...]  # owners whose shard I kept as it was
    bytes_sent: int = 0  # tensor payload bytes this member sent


class GroupAllReduce:
    """This member's part of one group's all-reduce (see the module docstring)."""

    def __init__(self, net: PeerNet, group: GroupInfo, config: AllReduceConfig) -> None:
        self.net = net
        self.group = group
        self.config = config
        self.me = group.index(net.rank)
        self._sent = 0

    async def run(self, x: torch.Tensor) -> AllReduceOutcome:
        """Average ``x`` (flat, floating point) with the group; returns the new vector."""
        if x.dim() != 1 or not x.dtype.is_floating_point:
            raise ValueError(f"need a flat floating-point vector, got {tuple(x.shape)} {x.dtype}")
        flat = x.detach().contiguous()
        bounds = shard_bounds(flat.numel(), self.group.fractions)
        loop = asyncio.get_running_loop()
        start = loop.time()
        _, (mine, contributors, excluded), gathered = await asyncio.gather(
            self.scatter(flat, bounds, start + self.config.sender_timeout_s),
            self._reduce_and_answer(flat, bounds, start),
            self._gather(flat, bounds, start + self.config.reducer_timeout_s),
        )
        out = torch.empty_like(flat)  # every shard is written below: its mean, or my own values
        failed = []
        for j, (a, b) in enumerate(bounds):
            avg = mine if j == self.me else gathered.get(j)
            if avg is not None:
                blend_into(out[a:b], flat[a:b], avg, self.config.alpha)
            else:
                out[a:b].copy_(flat[a:b])
                if j != self.me and b > a:
                    failed.append(self.group.members[j])
        return AllReduceOutcome(out, contributors, excluded, tuple(failed), self._sent)

    # -- steps (overridable for fault injection) --------------------------------------------------
    async def scatter(self, flat: torch.Tensor, bounds: tuple[Bounds, ...], deadline: float) -> None:
        """Send my copy of every other member's shard to it."""
        await asyncio.gather(
            *(
                self._send_range(j, flat[a:b], self.group.copy_tag, deadline)
                for j, (a, b) in enumerate(bounds)
                if j != self.me
            )
        )

    async def reduce(
        self, flat: torch.Tensor, bounds: tuple[Bounds, ...], deadline: float
    ) -> tuple[torch.Tensor | None, tuple[int, ...], tuple[int, ...]]:
        """Average the copies of my shard that arrive complete by ``deadline``: ``(mean, contributors, excluded)``."""
        a, b = bounds[self.me]
        others = [j for j in range(len(self.group.members)) if j != self.me]
        copies = await asyncio.gather(
            *(self._recv_range(j, b - a, flat.dtype, self.group.copy_tag, deadline) for j in others)
        )
        arrived = {j: c for j, c in zip(others, copies, strict=True) if c is not None}
        order = sorted([self.me, *arrived])
        pieces = [(self.group.weights[j], flat[a:b] if j == self.me else arrived[j]) for j in order]
        mean = weighted_mean(pieces) if b > a else flat[a:b].clone()
        members = self.group.members
        excluded = tuple(members[j] for j in others if j not in arrived)
        return mean, tuple(members[j] for j in order), excluded

    # -- internals --------------------------------------------------------------------------------
    async def _reduce_and_answer(
        self, flat: torch.Tensor, bounds: tuple[Bounds, ...], start: float
    ) -> tuple[torch.Tensor | None, tuple[int, ...], tuple[int, ...]]:
        mean, contributors, excluded = await self.reduce(flat, bounds, start + self.config.sender_timeout_s)
        answer_by = start + self.config.reducer_timeout_s
        index = {rank: j for j, rank in enumerate(self.group.members)}
        jobs = []
        for rank in self.group.members:
            if rank == self.net.rank:
                continue
            if mean is not None and rank in contributors:
                jobs.append(self._send_range(index[rank], mean, self.group.mean_tag, answer_by))
            else:
                jobs.append(self._notify_excluded(rank, answer_by))
        await asyncio.gather(*jobs)
        return mean, contributors, excluded

    async def _gather(self, flat: torch.Tensor, bounds: tuple[Bounds, ...], deadline: float) -> dict[int, torch.Tensor]:
        owners = [j for j in range(len(self.group.members)) if j != self.me]
        means = await asyncio.gather(
            *(
                self._recv_range(j, bounds[j][1] - bounds[j][0], flat.dtype, self.group.mean_tag, deadline)
                for j in owners
            )
        )
        return {j: m for j, m in zip(owners, means, strict=True) if m is not None}

    def _part_elems(self, dtype: torch.dtype) -> int:
        return max(1, self.config.part_bytes // torch.empty(0, dtype=dtype).element_size())

    async def _send_range(self, j: int, view: torch.Tensor, tag: int, deadline: float) -> None:
        peer = self.group.members[j]
        step = self._part_elems(view.dtype)
        try:
            for start in range(0, view.numel(), step):
                piece = view[start : start + step]
                message = Message.of_tensor(piece, round=self.group.round, tag=tag)
                await self.net.send(peer, message, timeout=_left(deadline))
                self._sent += piece.numel() * piece.element_size()
        except TransportError as exc:
            logger.info("rank %d: sending to %d in group %d failed: %s", self.net.rank, peer, self.group.group_id, exc)

    async def _notify_excluded(self, peer: int, deadline: float) -> None:
        notice = excluded(self.group, as_owner=True)
        try:
            await self.net.send(peer, notice, timeout=_left(deadline))
        except TransportError as exc:
            logger.debug("rank %d: no exclusion notice to %d: %s", self.net.rank, peer, exc)

    async def _recv_range(
        self, j: int, numel: int, dtype: torch.dtype, tag: int, deadline: float
    ) -> torch.Tensor | None:
        """``numel`` elements from member ``j`` in parts, or None (timeout, exclusion notice, bad piece)."""
        peer = self.group.members[j]
        out = torch.empty(numel, dtype=dtype)
        step = self._part_elems(dtype)
        try:
            for start in range(0, numel, step):
                message = await self.net.recv(peer, tag, round=self.group.round, timeout=_left(deadline))
                piece = message.tensor
                if piece is None:
                    return None  # EXCLUDED: keep my own values
                size = min(step, numel - start)
                if piece.dtype != dtype or piece.numel() != size:
                    logger.warning(
                        "rank %d: member %d sent %d x %s, expected %d x %s",
                        self.net.rank,
                        peer,
                        piece.numel(),
                        piece.dtype,
                        size,
                        dtype,
                    )
                    return None
                out[start : start + size] = piece.reshape(-1)
        except TransportError as exc:
            logger.info(
                "rank %d: nothing usable from %d in group %d: %s", self.net.rank, peer, self.group.group_id, exc
            )
            return None
        return out


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time()) if math.isfinite(deadline) else math.inf
