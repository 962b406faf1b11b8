"""The receive side shared by all transports: matching, ordering, failure after data, deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import pytest
import torch

from squall.transport.errors import PeerFailed, TransportClosed, TransportTimeout
from squall.transport.mailbox import Mailbox
from squall.wire import Message

T = TypeVar("T")


def run(awaitable: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(awaitable, 10)

    return asyncio.run(main())


def msg(round: int, tag: int = 0) -> Message:
    return Message.of_tensor(torch.tensor([round]), round=round, tag=tag)


def test_fifo_per_peer_and_arrival_order_for_any_peer() -> None:
    async def main() -> None:
        box = Mailbox([1, 2])
        for peer, rnd in [(1, 0), (2, 10), (1, 1), (2, 11)]:
            box.deliver(peer, msg(rnd))
        assert (await box.receive(2, timeout=0)).round == 10
        assert [(await box.receive(None, timeout=0)).round for _ in range(3)] == [0, 1, 11]

    run(main())


def test_tag_and_round_filters_skip_but_keep_other_messages() -> None:
    async def main() -> None:
        box = Mailbox([1])
        box.deliver(1, msg(0, tag=5))
        box.deliver(1, msg(1, tag=6))
        box.deliver(1, msg(2, tag=5))
        assert (await box.receive(1, tag=6, timeout=0)).round == 1
        assert (await box.receive(1, round=2, timeout=0)).round == 2
        assert (await box.receive(1, timeout=0)).round == 0
        assert box.queued() == 0

    run(main())


def test_waiters_are_served_in_order_and_by_match() -> None:
    async def main() -> None:
        box = Mailbox([1, 2])
        any_tag7 = asyncio.create_task(box.receive(None, tag=7, timeout=5))
        from_two = asyncio.create_task(box.receive(2, timeout=5))
        await asyncio.sleep(0)
        box.deliver(2, msg(1, tag=0))
        box.deliver(1, msg(2, tag=7))
        assert (await from_two).round == 1 and (await any_tag7).round == 2

    run(main())


def test_failure_comes_after_queued_data() -> None:
    async def main() -> None:
        box = Mailbox([1, 2])
        box.deliver(1, msg(0))
        box.fail(1, PeerFailed(1, "gone"))
        assert (await box.receive(1, timeout=0)).round == 0
        with pytest.raises(PeerFailed, match="gone"):
            await box.receive(1, timeout=5)
        pending = asyncio.create_task(box.receive(None, timeout=5))
        await asyncio.sleep(0)
        box.fail(2, PeerFailed(2, "also gone"))
        with pytest.raises(PeerFailed, match="every peer"):
            await pending

    run(main())


def test_pending_receive_fails_when_its_peer_fails() -> None:
    async def main() -> None:
        box = Mailbox([1, 2])
        pending = asyncio.create_task(box.receive(1, timeout=5))
        await asyncio.sleep(0)
        box.fail(1, PeerFailed(1, "reset"))
        with pytest.raises(PeerFailed, match="reset"):
            await pending

    run(main())


def test_timeout_raises_transport_timeout() -> None:
    async def main() -> None:
        box = Mailbox([1])
        with pytest.raises(TransportTimeout) as info:
            await box.receive(1, timeout=0.01)
        assert info.value.peer == 1 and isinstance(info.value, TimeoutError)

    run(main())


def test_a_message_handed_to_a_cancelled_waiter_is_requeued() -> None:
    async def main() -> None:
        box = Mailbox([1])
        waiter = asyncio.create_task(box.receive(1, timeout=5))
        await asyncio.sleep(0)
        box.deliver(1, msg(3))  # resolves the waiter's future...
        waiter.cancel()  # ...but the task is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (await box.receive(1, timeout=0)).round == 3

    run(main())


def test_close_fails_everything() -> None:
    async def main() -> None:
        box = Mailbox([1])
        pending = asyncio.create_task(box.receive(1, timeout=5))
        await asyncio.sleep(0)
        box.close(TransportClosed("bye"))
        with pytest.raises(TransportClosed):
            await pending
        with pytest.raises(TransportClosed):
            await box.receive(1, timeout=5)

    run(main())
