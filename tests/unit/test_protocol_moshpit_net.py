"""Moshpit's messaging (the rejoinable transport): inbox, in-process hub, TCP endpoints that survive a restart."""

from __future__ import annotations

import asyncio

import pytest
import torch

from squall.protocols.moshpit import AveragerConfig, Grid, MoshpitAverager
from squall.protocols.moshpit.messages import CONTROL_TAG
from squall.transport import InProcHub, PeerUnreachable, TcpPeerNet, TransportTimeout
from squall.transport.rejoinable import Inbox
from squall.transport.rejoinable_tcp import close_all, local_nets
from squall.transport.tcp import bind_listener
from squall.wire import Message


def same(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and torch.equal(a, b)


def test_inbox_matches_sender_tag_and_round_and_purges() -> None:
    async def main() -> None:
        inbox = Inbox()
        inbox.deliver(1, Message.of_tensor(torch.ones(2), round=3, tag=7))
        inbox.deliver(1, Message.of_tensor(torch.zeros(2), round=4, tag=7))
        assert (await inbox.take(1, 7, round=4, timeout=0)).round == 4
        with pytest.raises(TransportTimeout):
            await inbox.take(2, 7, round=None, timeout=0.01)
        waiter = asyncio.ensure_future(inbox.take(2, 9, round=5, timeout=1))
        await asyncio.sleep(0)
        inbox.deliver(2, Message.of_tensor(torch.ones(1), round=5, tag=9))
        assert (await waiter).sender is None and inbox.queued() == 1
        assert inbox.purge(lambda m: m.round > 3) == 1 and inbox.queued() == 0

    asyncio.run(main())


def test_inproc_hub_drops_traffic_of_a_killed_endpoint_and_revives_it_fresh() -> None:
    async def main() -> None:
        hub = InProcHub(3, latency=0.001)
        got: list[tuple[int, int]] = []
        hub.endpoints[1].handle_control(CONTROL_TAG, lambda sender, m: got.append((sender, m.round)))
        await hub.endpoints[0].send(1, Message.of_control({"op": 1}, round=1, tag=CONTROL_TAG), timeout=1)
        await hub.endpoints[2].send(1, Message.of_tensor(torch.ones(3), round=2, tag=5), timeout=1)
        await asyncio.sleep(0.01)
        assert got == [(0, 1)]
        assert same((await hub.endpoints[1].recv(2, 5, round=2, timeout=0)).tensor, torch.ones(3))
        hub.kill(1)
        await hub.endpoints[0].send(1, Message.of_tensor(torch.ones(1), round=3, tag=5), timeout=1)  # vanishes
        with pytest.raises(PeerUnreachable):
            await hub.endpoints[1].send(0, Message.of_tensor(torch.ones(1), round=3, tag=5), timeout=1)
        fresh = hub.revive(1)
        await hub.endpoints[0].send(1, Message.of_tensor(torch.ones(1), round=4, tag=5), timeout=1)
        assert (await fresh.recv(0, 5, round=None, timeout=1)).round == 4

    asyncio.run(main())


def test_tcp_peer_restarts_on_the_same_port_and_is_talked_to_again() -> None:
    async def main() -> None:
        nets = await local_nets(3)
        try:
            big = torch.arange(300_000, dtype=torch.float32)
            await nets[0].send(2, Message.of_tensor(big, round=1, tag=5), timeout=5)
            assert same((await nets[2].recv(0, 5, round=1, timeout=5)).tensor, big)
            port = nets[2].addresses[2][1]
            await nets[2].close()
            with pytest.raises((PeerUnreachable, TransportTimeout)):
                for _ in range(50):  # the stale connection is reset, then dialling is refused
                    await nets[0].send(2, Message.of_tensor(torch.ones(4), round=2, tag=5), timeout=1)
                    await asyncio.sleep(0.02)
            sock = bind_listener("127.0.0.1", port)
            nets[2] = TcpPeerNet(rank=2, addresses=nets[0].addresses, incarnation=99, listen_sock=sock)
            await nets[2].start()
            await nets[0].send(2, Message.of_tensor(torch.ones(4), round=3, tag=5), timeout=5)
            await nets[1].send(2, Message.of_tensor(torch.ones(4), round=3, tag=5), timeout=5)
            assert (await nets[2].recv(0, 5, round=3, timeout=5)).round == 3
            assert (await nets[2].recv(1, 5, round=3, timeout=5)).round == 3
            assert nets[0].counters.bytes_sent > big.numel() * 4
        finally:
            await close_all(nets)

    asyncio.run(main())


def test_averaging_over_tcp_on_loopback_is_exact() -> None:
    grid = Grid(2, 2)
    config = AveragerConfig(heartbeat_s=0.1, peer_timeout_s=1.0, matchmaking_s=2.0)

    async def main() -> None:
        nets = await local_nets(4)
        averagers = [MoshpitAverager(n, grid=grid, config=config, seed=n.rank) for n in nets]
        try:
            for averager in averagers:
                await averager.start()
            xs = [torch.full((100_000,), float(r), dtype=torch.float64) for r in range(4)]
            for _ in range(2):
                results = await asyncio.gather(*(a.step(x) for a, x in zip(averagers, xs, strict=True)))
                xs = [r.x for r in results]
            assert all(torch.equal(x, torch.full((100_000,), 1.5, dtype=torch.float64)) for x in xs)
        finally:
            for averager in averagers:
                await averager.close()

    asyncio.run(main())
