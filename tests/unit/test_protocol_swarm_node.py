"""SwarmSGD's exchange protocol between in-process nodes: averages, crossing offers, busy, fallbacks, timeouts.

Models are set by hand and nobody trains, so every effect on the models comes from the exchanges.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
import torch

from squall.gossip.graphs import complete_graph
from squall.protocols.swarm.frames import SWARM_TAG, Frame, FrameKind, to_message
from squall.protocols.swarm.node import SwarmNode
from squall.protocols.swarm.options import SwarmOptions
from squall.protocols.swarm.schedule import node_rng
from squall.transport import InProcTransport, inproc_mesh
from squall.transport.inproc import LatencyFn
from squall.wire import Message

DIM = 32
#: float32 sums of a few vectors of size ~10: rounding stays far below this.
SUM_TOLERANCE = 1e-4


def make_nodes(
    models: Sequence[torch.Tensor], *, options: SwarmOptions | None = None, latency: float | LatencyFn = 0.001
) -> tuple[list[SwarmNode], list[InProcTransport]]:
    transports = inproc_mesh(len(models), latency=latency)
    graph = complete_graph(len(models))
    nodes = [
        SwarmNode(t, graph, models[r], options=options or SwarmOptions(), rng=node_rng(0, r))
        for r, t in enumerate(transports)
    ]
    for node in nodes:
        node.start()
    return nodes, transports


async def settle(nodes: Sequence[SwarmNode], until: Callable[[], bool] | None = None, limit: float = 5.0) -> None:
    """Wait until no node has an offer in flight (or ``until`` holds)."""
    done = until or (lambda: all(n.active is None for n in nodes))
    async with asyncio.timeout(limit):
        while not done():
            await asyncio.sleep(0.002)


async def shutdown(nodes: Sequence[SwarmNode], transports: Sequence[InProcTransport]) -> None:
    await asyncio.gather(*(n.finish() for n in nodes))
    for t in transports:
        await t.close()


def total(nodes: Sequence[SwarmNode]) -> torch.Tensor:
    return torch.stack([n.params for n in nodes]).double().sum(0)


def models(*values: float) -> list[torch.Tensor]:
    return [torch.full((DIM,), v) + torch.linspace(0, 1, DIM) for v in values]


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


def test_one_exchange_in_full_precision_leaves_both_at_the_average() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 4.0), options=SwarmOptions(bits=32))
        assert await nodes[0].start_offer(1) == 1
        await settle(nodes)
        torch.testing.assert_close(nodes[0].params, models(2.0)[0])
        torch.testing.assert_close(nodes[1].params, nodes[0].params)
        assert (nodes[0].counters.completed, nodes[1].counters.answered) == (1, 1)
        await shutdown(nodes, transports)

    run(main)


def test_quantized_exchanges_keep_the_sum_and_cost_about_bits_per_coordinate() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 1.0), options=SwarmOptions(bits=4))
        start = total(nodes)
        for round_ in range(6):
            await nodes[round_ % 2].start_offer()
            await settle(nodes)
            nodes[0].params = nodes[0].params + 0.5  # training moves the models apart again
            nodes[1].params = nodes[1].params - 0.5
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        assert nodes[0].counters.offer_fallbacks + nodes[1].counters.offer_fallbacks == 0
        sent = [n.counters for n in nodes]
        # the very first offer goes in full precision (no distance known yet); everything else in 4 bits
        assert sum(c.bits_sent for c in sent) == 32 + 4 * (sum(c.vectors_sent for c in sent) - 1)
        await shutdown(nodes, transports)

    run(main)


def test_crossing_offers_become_one_exchange_not_a_swap() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 4.0), options=SwarmOptions(bits=32), latency=0.02)
        await asyncio.gather(nodes[0].start_offer(1), nodes[1].start_offer(0))
        await settle(nodes)
        assert (nodes[0].counters.completed, nodes[1].counters.busy_received) == (1, 1)
        assert (nodes[1].counters.answered, nodes[0].counters.busy_sent) == (1, 1)
        torch.testing.assert_close(nodes[0].params, models(2.0)[0])
        torch.testing.assert_close(nodes[1].params, models(2.0)[0])
        await shutdown(nodes, transports)

    run(main)


def test_an_offer_that_fails_its_checksum_is_resent_in_full_precision() -> None:
    async def main() -> None:
        options = SwarmOptions(bits=4, eps=1e-3)  # radius 7.5e-3, the models are 10 apart
        nodes, transports = make_nodes(models(0.0, 10.0), options=options)
        start = total(nodes)
        await nodes[0].start_offer(1)
        await settle(nodes)
        assert nodes[1].counters.decode_failures == 1 and nodes[0].counters.offer_fallbacks == 1
        assert nodes[0].counters.completed == 1
        torch.testing.assert_close(nodes[0].params, nodes[1].params)
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        await shutdown(nodes, transports)

    run(main)


def test_a_node_answers_one_offer_while_its_own_is_in_flight_and_refuses_the_next() -> None:
    def latency(src: int, dst: int, nbytes: int) -> float:
        return 0.3 if (src, dst) == (1, 2) else 0.002

    async def main() -> None:
        options = SwarmOptions(bits=32)
        nodes, transports = make_nodes(models(0.0, 1.0, 2.0, 3.0), options=options, latency=latency)
        start = total(nodes)
        await nodes[1].start_offer(2)  # in flight for 0.3 s
        await nodes[0].start_offer(1)
        await settle(nodes, until=lambda: nodes[0].active is None, limit=0.25)
        await nodes[3].start_offer(1)
        await settle(nodes, until=lambda: nodes[3].active is None, limit=0.25)
        assert nodes[0].counters.completed == 1 and nodes[3].counters.busy_received == 1
        assert nodes[1].counters.busy_sent == 1 and nodes[1].active is not None
        await settle(nodes)
        assert nodes[1].counters.completed == 1
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        await shutdown(nodes, transports)

    run(main)


def test_a_given_up_offer_is_still_applied_when_its_answer_arrives_late() -> None:
    def latency(src: int, dst: int, nbytes: int) -> float:
        return 0.3 if (src, dst) == (1, 0) else 0.001

    async def main() -> None:
        options = SwarmOptions(bits=32, exchange_timeout=0.1)
        nodes, transports = make_nodes(models(0.0, 4.0), options=options, latency=latency)
        start = total(nodes)
        await nodes[0].start_offer(1)
        await asyncio.sleep(0.15)
        assert nodes[0].can_offer() and nodes[0].counters.timeouts == 1
        await settle(nodes, until=lambda: nodes[0].counters.completed == 1)
        torch.testing.assert_close(nodes[0].params, nodes[1].params)
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        await shutdown(nodes, transports)

    run(main)


def test_a_silent_partner_is_avoided_after_a_timeout_while_others_are_left() -> None:
    def latency(src: int, dst: int, nbytes: int) -> float:
        return 10.0 if dst == 2 else 0.001  # node 2 never hears anything in time (like a paused container)

    async def main() -> None:
        options = SwarmOptions(bits=32, exchange_timeout=0.05, drain_timeout=0.2)
        nodes, transports = make_nodes(models(0.0, 1.0, 2.0), options=options, latency=latency)
        await nodes[0].start_offer(2)
        await asyncio.sleep(0.06)
        assert nodes[0].can_offer() and nodes[0].live_neighbours() == [1]
        for _ in range(10):
            assert await nodes[0].start_offer() == 1
            await settle(nodes[:2])
        assert nodes[0].counters.timeouts == 1
        await asyncio.gather(*(n.stop() for n in nodes))
        for t in transports:
            await t.close()

    run(main)


def test_a_dead_peer_is_avoided_and_does_not_hold_up_the_end() -> None:
    async def main() -> None:
        options = SwarmOptions(drain_timeout=2.0)
        nodes, transports = make_nodes(models(0.0, 1.0, 2.0), options=options)
        await nodes[2].stop()
        await transports[2].close()
        await asyncio.sleep(0.01)
        assert nodes[0].live_neighbours() == [1]
        for _ in range(5):
            assert await nodes[0].start_offer() == 1
            await settle(nodes)
        async with asyncio.timeout(1.0):
            await asyncio.gather(nodes[0].finish(), nodes[1].finish())
        for t in transports[:2]:
            await t.close()

    run(main)


def test_finishing_nodes_wait_for_offers_in_flight_then_everyone_stops() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 1.0, 2.0, 3.0, 4.0), latency=0.01)
        start = total(nodes)
        for node in nodes:
            await node.start_offer()
        await asyncio.gather(*(n.finish() for n in nodes))
        assert all(n.active is None and n.done == set(range(5)) - {n.rank} for n in nodes)
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        assert sum(n.counters.completed for n in nodes) == sum(n.counters.answered for n in nodes)
        for t in transports:
            await t.close()

    run(main)


def test_malformed_messages_are_dropped_and_counted() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 1.0))
        await transports[0].send(1, Message.of_tensor(torch.zeros(4, dtype=torch.uint8), tag=SWARM_TAG))
        await transports[0].send(1, Message.of_tensor(torch.zeros(4), tag=SWARM_TAG))
        short = Frame(FrameKind.OFFER, 0, np.zeros(DIM - 1, dtype=np.float32))  # well-formed, wrong size
        await transports[0].send(1, to_message(short))
        await asyncio.sleep(0.02)
        assert nodes[1].counters.bad_frames == 3
        await nodes[0].start_offer(1)
        await settle(nodes)
        assert nodes[0].counters.completed == 1
        await shutdown(nodes, transports)

    run(main)


def test_everyone_knows_when_every_node_has_reached_the_target() -> None:
    async def main() -> None:
        nodes, transports = make_nodes(models(0.0, 1.0, 2.0))
        for node in nodes[:2]:
            await node.announce_reached()
        await asyncio.sleep(0.01)
        assert not any(n.all_reached() for n in nodes)
        await nodes[2].announce_reached()
        await settle(nodes, until=lambda: all(n.all_reached() for n in nodes))
        await shutdown(nodes, transports)

    run(main)


def test_gossip_alone_reaches_the_average_of_the_initial_models() -> None:
    """No training: repeated random exchanges shrink the consensus distance to ~0 and keep the mean."""

    async def main() -> None:
        rng = np.random.default_rng(3)
        initial = [torch.from_numpy(rng.normal(scale=3.0, size=DIM).astype(np.float32)) for _ in range(8)]
        options = SwarmOptions(bits=8)
        nodes, transports = make_nodes(initial, options=options)
        start = total(nodes)
        for _ in range(40):
            await asyncio.gather(*(n.start_offer() for n in nodes))
            await settle(nodes)
        xs = torch.stack([n.params for n in nodes]).double()
        spread = float(((xs - xs.mean(0)) ** 2).sum(1).mean())
        assert spread < 1e-6, spread  # from about 9 * DIM = 288
        assert torch.allclose(total(nodes), start, atol=SUM_TOLERANCE)
        await shutdown(nodes, transports)

    run(main)
