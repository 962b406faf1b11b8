"""One conformance suite for every reliable transport: in-process (with and without latency) and TCP.

Each test builds a fresh mesh on 127.0.0.1 with ephemeral ports (or in memory), runs a scenario
under a hard deadline, closes every endpoint and checks that nothing was left behind: no
pending task, no unclosed socket, no error logged by asyncio.

The rejoinable transports (``rejoinable-*``: :class:`~squall.transport.PeerNet` in process and
over TCP, seen through :class:`~squall.transport.RejoinableTransport`) pass the same cases but
one difference by design: they have no failure state, so a peer that closed is never reported
as failed (:class:`PeerFailed`); a receive from it times out instead. The one case about failure
is replaced for them by :func:`test_a_closed_rejoinable_peer_is_silent_not_failed`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable

import pytest
import torch

from squall.transport import (
    InProcHub,
    PeerFailed,
    PeerNet,
    RejoinableTransport,
    Transport,
    TransportClosed,
    TransportTimeout,
    inproc_mesh,
    tcp_mesh,
)
from squall.transport.rejoinable_tcp import local_nets
from squall.wire import Message, WireError, encode_message

REJOINABLE = ["rejoinable-inproc", "rejoinable-inproc-latency", "rejoinable-tcp"]
KINDS = ["inproc", "inproc-latency", "tcp", *REJOINABLE]
#: The failure cases: a rejoinable transport never fails a peer, by design (see the module docstring); its
#: rows are not generated (not skipped): test_a_closed_rejoinable_peer_is_silent_not_failed stands for them.
FAILING_KINDS = [kind for kind in KINDS if kind not in REJOINABLE]
SCENARIO_DEADLINE = 30.0


async def make_mesh(kind: str, n: int, *, default_timeout: float) -> list[Transport]:
    if kind == "inproc":
        return list(inproc_mesh(n, default_timeout=default_timeout))
    if kind == "inproc-latency":
        rng = random.Random(1234 + n)  # seeded: latencies vary per message, so reordering would show
        return list(inproc_mesh(n, latency=lambda s, d, b: rng.uniform(0, 0.002), default_timeout=default_timeout))
    if kind == "tcp":
        return list(await tcp_mesh(n, default_timeout=default_timeout, connect_timeout=5.0))
    nets: list[PeerNet]
    if kind == "rejoinable-inproc":
        nets = list(InProcHub(n).endpoints)
    elif kind == "rejoinable-inproc-latency":
        nets = list(InProcHub(n, latency=0.001).endpoints)  # one latency for all: FIFO per link by construction
    else:
        assert kind == "rejoinable-tcp", kind
        nets = list(await local_nets(n))  # started
    return [RejoinableTransport(net, default_timeout=default_timeout) for net in nets]


def run_mesh(
    kind: str,
    n: int,
    scenario: Callable[[list[Transport]], Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
    *,
    default_timeout: float = 10.0,
) -> None:
    """Run ``scenario`` on a fresh mesh, then close it and check that it cleaned up after itself."""

    async def main() -> None:
        mesh = await make_mesh(kind, n, default_timeout=default_timeout)
        try:
            await asyncio.wait_for(scenario(mesh), SCENARIO_DEADLINE)
        finally:
            await asyncio.gather(*(t.close() for t in mesh))
        leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not leftover, f"tasks still pending after close: {leftover}"

    with caplog.at_level(logging.ERROR, logger="asyncio"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], "asyncio logged errors"
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [str(w.message) for w in caught]


def stamp(src: int, dst: int, size: int = 7) -> torch.Tensor:
    return torch.full((size,), float(100 * src + dst))


@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_every_ordered_pair_exchanges_a_tensor(kind: str, n: int, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        await asyncio.gather(*(t.send(p, Message.of_tensor(stamp(t.rank, p), round=1)) for t in mesh for p in t.peers))
        for t in mesh:
            for p in t.peers:
                got = await t.recv(p)
                assert got.sender == p and got.round == 1
                assert got.tensor is not None and torch.equal(got.tensor, stamp(p, t.rank))
        assert all(t.world_size == n for t in mesh) and [t.rank for t in mesh] == list(range(n))

    run_mesh(kind, n, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_messages_from_one_peer_arrive_in_order(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    sizes = [1, 50_000, 3, 200_000, 0, 7] * 10  # mixed sizes: a small message must not overtake a big one

    async def sender(t: Transport) -> None:
        for i, size in enumerate(sizes):
            await t.send(0, Message.of_tensor(torch.full((size,), float(i)), round=i))

    async def scenario(mesh: list[Transport]) -> None:
        sending = [asyncio.create_task(sender(t)) for t in mesh[1:]]
        assert [(await mesh[0].recv(1)).round for _ in sizes] == list(range(len(sizes)))
        rounds = [(m.sender, m.round) for m in [await mesh[0].recv() for _ in sizes]]
        assert [r for s, r in rounds if s == 2] == list(range(len(sizes)))
        await asyncio.gather(*sending)

    run_mesh(kind, 3, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_counters_equal_the_bytes_on_the_wire(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    messages = [
        Message.of_tensor(torch.randn(1000), round=1),
        Message.of_control({"step": 3, "peers": [0, 1, 2]}),
        Message.of_tensor(torch.zeros(0, 3, dtype=torch.int8)),
        Message.of_tensor(torch.tensor(True)),
    ]
    wire_bytes = sum(encode_message(m, sender=0).nbytes for m in messages)

    async def scenario(mesh: list[Transport]) -> None:
        for m in messages:
            await mesh[0].send(1, m)
        for _ in messages:
            await mesh[1].recv(0)
        sent, received = mesh[0].counters()[1], mesh[1].counters()[0]
        assert sent.bytes_sent == received.bytes_received == wire_bytes
        assert sent.messages_sent == received.messages_received == len(messages)
        assert sent.bytes_received == received.bytes_sent == 0
        assert mesh[0].counters()[2].bytes_sent == 0
        assert mesh[0].total_counters().bytes_sent == wire_bytes

    run_mesh(kind, 3, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_receives_time_out(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        start = time.monotonic()
        with pytest.raises(TransportTimeout) as info:
            await mesh[0].recv(1, timeout=0.05)
        # Its own deadline, not the transport's default (0.1 s), and never early; how late a loaded
        # host lets it end is not the transport's to promise.
        assert info.value.peer == 1 and info.value.timeout == 0.05 and time.monotonic() - start >= 0.04
        with pytest.raises(TransportTimeout):
            await mesh[0].recv(timeout=0.01)
        with pytest.raises(TransportTimeout):
            await mesh[0].recv(1)  # the transport's default deadline
        await mesh[1].send(0, Message.of_tensor(torch.ones(1), tag=5))
        with pytest.raises(TransportTimeout):
            await mesh[0].recv(1, tag=6, timeout=0.05)
        assert (await mesh[0].recv(1, tag=5)).tag == 5

    run_mesh(kind, 2, scenario, caplog, default_timeout=0.1)


@pytest.mark.parametrize("kind", FAILING_KINDS)
def test_a_closed_peer_fails_after_its_last_message(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        pending = asyncio.create_task(mesh[0].recv(2, timeout=10))
        await asyncio.sleep(0.01)
        for i in range(3):
            await mesh[1].send(0, Message.of_tensor(torch.ones(10_000), round=i))
        await mesh[1].close()
        assert [(await mesh[0].recv(1)).round for _ in range(3)] == [0, 1, 2]
        with pytest.raises(PeerFailed) as info:
            await mesh[0].recv(1)
        assert info.value.peer == 1
        with pytest.raises(PeerFailed):
            await mesh[0].send(1, Message.of_tensor(torch.ones(1)))
        await mesh[2].send(0, Message.of_tensor(torch.ones(1)))  # a live peer still works
        assert (await pending).sender == 2
        await mesh[2].close()
        with pytest.raises(PeerFailed):
            await mesh[0].recv(timeout=10)  # every peer is gone
        assert set(mesh[0].failed_peers) == {1, 2}

    run_mesh(kind, 3, scenario, caplog)


@pytest.mark.parametrize("kind", REJOINABLE)
def test_a_closed_rejoinable_peer_is_silent_not_failed(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """What a rejoinable transport does instead of failing a closed peer: its messages arrive, then silence."""

    async def scenario(mesh: list[Transport]) -> None:
        for i in range(3):
            await mesh[1].send(0, Message.of_tensor(torch.ones(10_000), round=i))
        await mesh[1].close()
        assert [(await mesh[0].recv(1)).round for _ in range(3)] == [0, 1, 2]
        with pytest.raises(TransportTimeout) as info:
            await mesh[0].recv(1, timeout=0.05)
        assert info.value.peer == 1
        await mesh[2].send(0, Message.of_tensor(torch.ones(1)))  # a live peer still works
        assert (await mesh[0].recv(timeout=10)).sender == 2
        assert mesh[0].failed_peers == {}

    run_mesh(kind, 3, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_a_64_mb_tensor_round_trips(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        big = torch.randn(16 << 20)  # 64 MiB of float32
        receiving = asyncio.create_task(mesh[1].recv(0))
        await mesh[0].send(1, Message.of_tensor(big, round=9))
        got = await receiving
        assert got.tensor is not None and torch.equal(got.tensor, big)
        assert mesh[1].counters()[0].bytes_received == encode_message(Message.of_tensor(big), sender=0).nbytes

    run_mesh(kind, 2, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_the_sender_may_reuse_its_tensor_once_send_returns(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        buffer = torch.zeros(100_000)
        await mesh[0].send(1, Message.of_tensor(buffer))
        buffer.fill_(1.0)
        got = await mesh[1].recv(0)
        assert got.tensor is not None and float(got.tensor.sum()) == 0.0

    run_mesh(kind, 2, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_messages_and_peers_are_refused_before_sending(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        with pytest.raises(WireError):
            await mesh[0].send(1, Message.of_tensor(torch.zeros(3, dtype=torch.complex64)))
        for bad in (0, 2, -1):
            with pytest.raises(ValueError, match="cannot talk"):
                await mesh[0].send(bad, Message.of_tensor(torch.zeros(1)))
        with pytest.raises(ValueError, match="timeout"):
            await mesh[0].recv(1, timeout=-1)
        assert mesh[0].counters()[1].messages_sent == 0
        await mesh[0].send(1, Message.of_tensor(torch.zeros(1)))
        assert (await mesh[1].recv(0)).tensor is not None

    run_mesh(kind, 2, scenario, caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_closing_fails_pending_and_later_operations(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(mesh: list[Transport]) -> None:
        await mesh[1].send(0, Message.of_tensor(torch.zeros(1)))  # TCP notices a close only on a connection
        await mesh[0].recv(1)
        pending = asyncio.create_task(mesh[0].recv(1, timeout=10))
        await asyncio.sleep(0.01)
        await mesh[0].close()
        await mesh[0].close()  # idempotent
        with pytest.raises(TransportClosed):
            await pending
        with pytest.raises(TransportClosed):
            await mesh[0].send(1, Message.of_tensor(torch.zeros(1)))
        with pytest.raises(TransportClosed):
            await mesh[0].recv(1)
        if kind in REJOINABLE:  # no failure state: the closed peer is silent
            with pytest.raises(TransportTimeout):
                await mesh[1].recv(0, timeout=0.05)
        else:
            with pytest.raises(PeerFailed):
                await mesh[1].recv(0)
        assert mesh[0].closed

    run_mesh(kind, 2, scenario, caplog)
