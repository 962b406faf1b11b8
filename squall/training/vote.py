"""Agreement on when to stop: every rank must leave the loop after the same step.

Synchronous algorithms deadlock if one rank stops while the others wait for it in a
collective, and a wall-clock budget or an accuracy target is met at different steps on
different ranks. So, at check steps, every rank votes: rank 0 gathers every flag, ORs them and
sends the decision back (``2(n-1)`` tiny messages, on their own tag so they never mix with the
algorithm's traffic; they are counted in the transport's counters like everything else).

A :data:`Vote` is any ``async (step, flag, *, reached=False) -> bool`` that returns the same value
on every rank. ``flag`` ("my budget is spent") stops everyone if any rank raises it; ``reached``
("my evaluation met the target") stops everyone only when every rank reports it, so a
decentralized protocol whose ranks hold different parameters trains until all of them get there.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from squall.transport import Transport
from squall.wire import Message


class Vote(Protocol):
    """``async (step, budget_spent, *, reached) -> decision``, the decision identical on every rank."""

    def __call__(self, step: int, flag: bool, *, reached: bool = False) -> Awaitable[bool]: ...

#: Message tag of votes and decisions ("SQVT").
VOTE_TAG = 0x53515654


class TransportVote:
    """OR of every rank's flag, gathered and broadcast by rank 0 over ``transport``.

    :param timeout: deadline of each message (``None``: the transport's default).
    """

    def __init__(self, transport: Transport, *, tag: int = VOTE_TAG, timeout: float | None = None) -> None:
        self.transport = transport
        self.tag = tag
        self.timeout = timeout

    async def __call__(self, step: int, flag: bool, *, reached: bool = False) -> bool:
        t = self.transport
        if t.world_size == 1:
            return flag or reached
        if t.rank != 0:
            ballot = {"stop": flag, "reached": reached}
            await t.send(0, Message.of_control(ballot, round=step, tag=self.tag), timeout=self.timeout)
            reply = await t.recv(0, tag=self.tag, round=step, timeout=self.timeout)
            return bool(reply.control and reply.control.get("stop"))
        any_spent, all_reached = flag, reached
        for peer in t.peers:
            msg = await t.recv(peer, tag=self.tag, round=step, timeout=self.timeout)
            any_spent = any_spent or bool(msg.control and msg.control.get("stop"))
            all_reached = all_reached and bool(msg.control and msg.control.get("reached"))
        decision = any_spent or all_reached
        for peer in t.peers:
            await t.send(peer, Message.of_control({"stop": decision}, round=step, tag=self.tag), timeout=self.timeout)
        return decision


async def local_vote(step: int, flag: bool, *, reached: bool = False) -> bool:
    """No agreement: for a single rank, or when every rank is known to decide alike."""
    return flag or reached
