"""Stop votes: a spent budget on any rank stops all; the target stops all only when every rank met it."""

from __future__ import annotations

import asyncio

import pytest

from squall.training.vote import Decision, TransportVote, local_vote
from squall.transport import inproc_mesh


async def _decide(spent: list[bool], reached: list[bool]) -> list[Decision]:
    transports = inproc_mesh(len(spent))
    for t in transports:
        await t.start()
    try:
        return list(await asyncio.gather(*(TransportVote(t)(7, s, reached=r)
                                           for t, s, r in zip(transports, spent, reached, strict=True))))
    finally:
        for t in transports:
            await t.close()


@pytest.mark.parametrize(
    ("spent", "reached", "decision"),
    [
        ([False, False, False], [True, True, False], False),  # one rank still short of the target
        ([False, False, False], [True, True, True], True),  # every rank got there
        ([False, True, False], [False, False, False], True),  # one rank's budget is spent
        ([False, False, False], [False, False, False], False),
    ],
)
def test_transport_vote(spent: list[bool], reached: list[bool], decision: bool) -> None:
    assert [d.stop for d in asyncio.run(_decide(spent, reached))] == [decision] * len(spent)


def test_one_rank_that_runs_out_soon_makes_every_rank_vote_every_step() -> None:
    async def decide() -> list[Decision]:
        transports = inproc_mesh(3)
        for t in transports:
            await t.start()
        try:
            return list(await asyncio.gather(*(TransportVote(t)(4, False, soon=(k == 2))
                                               for k, t in enumerate(transports))))
        finally:
            for t in transports:
                await t.close()

    assert asyncio.run(decide()) == [Decision(stop=False, soon=True)] * 3


def test_local_vote() -> None:
    assert asyncio.run(local_vote(1, False, reached=True)).stop is True
    assert asyncio.run(local_vote(1, False)).stop is False
