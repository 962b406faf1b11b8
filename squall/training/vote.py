"""Agreement on when to stop: every rank must leave the loop after the same step.

Synchronous algorithms deadlock if one rank stops while the others wait for it in a
collective, and a wall-clock budget or an accuracy target is met at different steps on
different ranks. So, at check steps, every rank votes: rank 0 gathers every flag, ORs them and
sends the decision back (``2(n-1)`` tiny messages, on their own tag so they never mix with the
algorithm's traffic; they are counted in the transport's counters like everything else).

A :data:`Vote` is any ``async (step, flag, *, reached=False, soon=False) -> Decision`` that returns
the same decision on every rank. ``flag`` ("my budget is spent") stops everyone if any rank raises
it; ``reached`` ("my evaluation met the target") stops everyone only when every rank reports it, so
a decentralized protocol whose ranks hold different parameters trains until all of them get there;
``soon`` ("my time budget runs out before the next regular vote") tells every rank to vote after
every step from then on, so a time budget ends the run within a step of it, not a vote interval.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from squall.transport import Transport
from squall.wire import Message


@dataclass(frozen=True)
class Decision:
    """What a vote decided, the same on every rank."""

    stop: bool  # every rank leaves the loop after this step
    soon: bool = False  # a rank's time budget runs out before the next regular vote: vote after every step

    def __bool__(self) -> bool:
        return self.stop


class Vote(Protocol):
    """``async (step, budget_spent, *, reached, soon) -> Decision``, identical on every rank."""

    def __call__(self, step: int, flag: bool, *, reached: bool = False, soon: bool = False) -> Awaitable[Decision]: ...

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

    async def __call__(self, step: int, flag: bool, *, reached: bool = False, soon: bool = False) -> Decision:
        t = self.transport
        if t.world_size == 1:
            return Decision(flag or reached, soon)
        if t.rank != 0:
            ballot = {"stop": flag, "reached": reached, "soon": soon}
            await t.send(0, Message.of_control(ballot, round=step, tag=self.tag), timeout=self.timeout)
            reply = await t.recv(0, tag=self.tag, round=step, timeout=self.timeout)
            return Decision(bool(reply.control and reply.control.get("stop")),
                            bool(reply.control and reply.control.get("soon")))
        any_spent, all_reached, any_soon = flag, reached, soon
        for peer in t.peers:
            msg = await t.recv(peer, tag=self.tag, round=step, timeout=self.timeout)
            any_spent = any_spent or bool(msg.control and msg.control.get("stop"))
            all_reached = all_reached and bool(msg.control and msg.control.get("reached"))
            any_soon = any_soon or bool(msg.control and msg.control.get("soon"))
        decision = Decision(any_spent or all_reached, any_soon)
        said = {"stop": decision.stop, "soon": decision.soon}
        for peer in t.peers:
            await t.send(peer, Message.of_control(said, round=step, tag=self.tag), timeout=self.timeout)
        return decision


async def local_vote(step: int, flag: bool, *, reached: bool = False, soon: bool = False) -> Decision:
    """No agreement: for a single rank, or when every rank is known to decide alike."""
    return Decision(flag or reached, soon)
