"""In-process transport specifics: injected latency, per-link FIFO under random latency."""

from __future__ import annotations

import asyncio
import random

import torch

from squall.transport import InProcNetwork, inproc_mesh
from squall.wire import Message, encode_message


def test_constant_latency_delays_delivery() -> None:
    async def main() -> None:
        a, b = inproc_mesh(2, latency=1.0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await a.send(1, Message.of_tensor(torch.ones(3)))
        sent = loop.time()
        await b.recv(0)
        received = loop.time()
        assert received - start >= 1.0  # delivery waits for the latency
        # sending never waits for it: a send that slept the latency would find the message already there
        assert received - sent >= 0.5

    asyncio.run(main())


def test_latency_function_sees_sender_receiver_and_frame_size() -> None:
    calls: list[tuple[int, int, int]] = []

    def latency(src: int, dst: int, nbytes: int) -> float:
        calls.append((src, dst, nbytes))
        return 0.0

    async def main() -> None:
        network = InProcNetwork(3, latency=latency)
        message = Message.of_tensor(torch.zeros(10))
        await network.endpoints[2].send(0, message)
        await network.endpoints[0].recv(2)
        assert calls == [(2, 0, encode_message(message, sender=2).nbytes)]

    asyncio.run(main())


def test_a_fast_message_never_overtakes_a_slow_one_on_the_same_link() -> None:
    rng = random.Random(5)

    async def main() -> None:
        a, b = inproc_mesh(2, latency=lambda s, d, n: rng.choice([0.0, 0.02]))
        for i in range(50):
            await a.send(1, Message.of_tensor(torch.tensor([i]), round=i))
        assert [(await b.recv(0)).round for _ in range(50)] == list(range(50))

    asyncio.run(main())


def test_received_tensors_never_alias_the_senders() -> None:
    async def main() -> None:
        a, b = inproc_mesh(2)
        sent = torch.zeros(4)
        await a.send(1, Message.of_tensor(sent))
        received = (await b.recv(0)).tensor
        assert received is not None
        received += 1
        assert float(sent.sum()) == 0.0

    asyncio.run(main())
