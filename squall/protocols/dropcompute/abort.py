"""The abort notice: how a rank that saw a peer fail tells every other rank, so each names that peer.

In a ring all-reduce a rank talks to its two neighbours only, so when a worker is killed only its
neighbours see the broken connection; the others would fail later, each naming whichever
neighbour gave up next. The first rank whose step fails therefore sends every peer a small control
message (``ABORT_TAG``: the step and the failed peers with the reasons it saw), and every rank
watches for one while it trains: on receipt it stops with an error naming the failed peers.

:func:`announce` sends one, :func:`watch` waits for one, :func:`blame` words the error. The notice
comes from the network: :func:`decode_notice` validates it (types, ranges, lengths) and nothing
trusts it beyond that.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from squall.transport import Transport, TransportError
from squall.wire import Message
from squall.wire.control import JsonValue

#: Message tag of abort notices ("DCAB").
ABORT_TAG = 0x44434142
MAX_REASON = 200  # characters of a reason kept from a notice
#: Seconds an abort notice may take to reach one peer (a dead or silent peer is not waited for longer).
ANNOUNCE_TIMEOUT_S = 2.0
#: The reason a transport gives for a peer that said goodbye (it stopped on purpose, e.g. after a failure).
CLOSED = "closed by peer"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AbortNotice:
    """Rank ``sender`` could not finish step ``step``: ``failed`` maps the peers it saw fail to why."""

    sender: int
    step: int
    error: str  # the error that rank saw
    failed: Mapping[int, str]

    def describe(self) -> str:
        """One line naming the failed peers."""
        peers = "; ".join(f"peer {p}: {why}" for p, why in sorted(self.failed.items())) or "none known"
        return f"rank {self.sender} failed at step {self.step}: {self.error} (failed peers: {peers})"


def encode_notice(step: int, error: str, failed: Mapping[int, str], *, round: int = 0) -> Message:
    """The control message announcing that this rank's ``step`` failed with ``error``, because of ``failed``."""
    pairs: list[JsonValue] = []
    for peer, why in sorted(failed.items()):
        entry: list[JsonValue] = [int(peer), str(why)[:MAX_REASON]]
        pairs.append(entry)
    return Message.of_control({"step": int(step), "error": error[:MAX_REASON], "failed": pairs}, round=round,
                              tag=ABORT_TAG)


def decode_notice(message: Message, *, world_size: int) -> AbortNotice:
    """Validate a received notice; ValueError when it is not one."""
    obj, sender = message.control, -1 if message.sender is None else message.sender
    if not isinstance(obj, Mapping):
        raise ValueError(f"abort notice from rank {sender} carries no control object")
    step, error, pairs = obj.get("step"), obj.get("error"), obj.get("failed")
    if not isinstance(error, str):
        raise ValueError(f"abort notice from rank {sender}: error must be a string, got {error!r}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"abort notice from rank {sender}: bad step {step!r}")
    if not isinstance(pairs, list) or len(pairs) > world_size:
        raise ValueError(f"abort notice from rank {sender}: failed must be a list of at most {world_size}")
    failed: dict[int, str] = {}
    for pair in pairs:
        entry = _entry(pair, world_size)
        if entry is None:
            raise ValueError(f"abort notice from rank {sender}: bad entry {pair!r}")
        failed[entry[0]] = entry[1]
    return AbortNotice(sender=sender, step=step, error=error[:MAX_REASON], failed=failed)


def _entry(pair: object, world_size: int) -> tuple[int, str] | None:
    """``[peer, reason]`` with a peer in range and a string reason (cut short), else None."""
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    peer, reason = pair
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < world_size or not isinstance(reason, str):
        return None
    return peer, reason[:MAX_REASON]


async def announce(transport: Transport, step: int, error: str, failed: Mapping[int, str]) -> None:
    """Best effort: tell every peer still reachable that ``step`` failed here with ``error``, and why."""
    t = transport
    live = [p for p in t.peers if p not in t.failed_peers and p not in failed]

    async def tell(peer: int) -> None:
        try:
            await t.send(peer, encode_notice(step, error, failed), timeout=ANNOUNCE_TIMEOUT_S)
        except TransportError as exc:
            logger.debug("rank %d: abort notice to %d not sent: %s", t.rank, peer, exc)

    await asyncio.gather(*(tell(p) for p in live))


async def watch(transport: Transport) -> AbortNotice | None:
    """The first valid abort notice a peer sends (None once no peer is left to send one)."""
    while True:
        try:
            message = await transport.recv(None, tag=ABORT_TAG, timeout=math.inf)
        except TransportError:
            return None
        try:
            return decode_notice(message, world_size=transport.world_size)
        except ValueError as exc:
            logger.warning("rank %d: ignored an invalid abort notice: %s", transport.rank, exc)


def blame(failed: Mapping[int, str], notice: AbortNotice | None) -> str:
    """The failed peers, lost ones (a broken connection, a missed deadline) before those that closed cleanly."""
    merged = dict(failed)
    via: dict[int, int] = {}
    if notice is not None:
        for peer, why in notice.failed.items():
            if peer not in merged or merged[peer] == CLOSED:
                merged[peer], via[peer] = why, notice.sender
    lost = [p for p in sorted(merged) if merged[p] != CLOSED]
    closed = [p for p in sorted(merged) if merged[p] == CLOSED]
    named = [f"peer {p} lost ({merged[p]}{f', seen by rank {via[p]}' if p in via else ''})" for p in lost]
    named += [f"peer {p} closed" for p in closed]
    return "failed peers: " + (", ".join(named) or "none known")
