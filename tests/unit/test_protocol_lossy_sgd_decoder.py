"""lossy_sgd's receive path under hostile datagrams: each is dropped and counted by reason, never raises,
never reaches a sum. Datagrams go through ``LossyLink.on_datagram`` exactly as the socket hands them over."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

from squall.protocols.lossy_sgd.inbox import DROP_REASONS, Inbox
from squall.protocols.lossy_sgd.link import LossyLink, bind
from squall.protocols.lossy_sgd.packets import Layout, Phase, encode_packets, tag_of
from squall.wire import Message, encode_message

WORKERS = 3
LAYOUT = Layout(12, WORKERS, 4)  # shards of 4 coordinates, one packet each
HOST = "127.0.0.1"


def chunk(values: torch.Tensor, *, sender: int = 1, phase: Phase = Phase.GRADIENT, shard: int = 0, iteration: int = 0,
          full: tuple[int, ...] = (4,), offset: int = 0, chunk_id: int = 0, count: int = 1, crc: bool = True) -> bytes:
    message = Message.of_chunk(values, full_shape=full, offset=offset, chunk_id=chunk_id, chunk_count=count,
                               round=iteration, tag=tag_of(phase, shard))
    return encode_message(message, sender=sender, crc=crc).tobytes()


GOOD = torch.tensor([1.0, 2.0, 3.0, 4.0])


def flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def run_link(feed: Callable[[LossyLink, dict[int, tuple[str, int]]], None]) -> tuple[Inbox, LossyLink]:
    """A started rank-0 link in a 3-rank run (ranks 1 and 2 are addresses only); ``feed`` calls on_datagram."""

    async def main() -> tuple[Inbox, LossyLink]:
        socks = [bind(HOST, 0) for _ in range(WORKERS)]
        peers = {r: (HOST, int(s.getsockname()[1])) for r, s in enumerate(socks)}
        inbox = Inbox(LAYOUT, rank=0, resync=True, window=2)
        link = LossyLink(rank=0, peers=peers, layout=LAYOUT, inbox=inbox, resync=True, sock=socks[0])
        await link.start()
        try:
            feed(link, peers)
        finally:
            await link.close()
            for s in socks[1:]:
                s.close()
        return inbox, link

    return asyncio.run(main())


HOSTILE: dict[str, tuple[str, Callable[[], bytes]]] = {
    "garbage": ("malformed", lambda: b"\x00" * 60),
    "truncated": ("malformed", lambda: chunk(GOOD)[:-3]),
    "flipped payload byte": ("malformed", lambda: flip_last(chunk(GOOD))),
    "control message": ("malformed", lambda: encode_message(Message.of_control({"x": 1}), sender=1).tobytes()),
    "unknown phase": ("malformed", lambda: encode_message(
        Message.of_chunk(GOOD, full_shape=(4,), offset=0, chunk_id=0, chunk_count=1, tag=(9 << 20)),
        sender=1, crc=True).tobytes()),
    "shard beyond the run": ("malformed", lambda: chunk(GOOD, shard=5)),
    "wrong packet count": ("malformed", lambda: chunk(GOOD[:2], full=(4,), count=2)),
    "float64 block": ("malformed", lambda: chunk(GOOD.double())),
    "wrong shard length": ("malformed", lambda: chunk(GOOD[:3], full=(3,))),
    "wrong offset": ("malformed", lambda: chunk(GOOD[:2], full=(6,), offset=4)),
    "nan": ("malformed", lambda: chunk(torch.tensor([1.0, float("nan"), 3.0, 4.0]))),
    "inf": ("malformed", lambda: chunk(torch.tensor([1.0, float("inf"), 3.0, 4.0]))),
    "gradient for another owner": ("not_mine", lambda: chunk(GOOD, shard=2)),
    "broadcast from a non-owner": ("not_mine", lambda: chunk(GOOD, phase=Phase.BROADCAST, shard=2)),
    "broadcast of my own shard": ("not_mine", lambda: chunk(GOOD, phase=Phase.BROADCAST, shard=0)),
    "probe of another shard": ("not_mine", lambda: chunk(GOOD, phase=Phase.PROBE, shard=1)),
    "future iteration": ("future", lambda: chunk(GOOD, iteration=3)),
    "far future iteration": ("future", lambda: chunk(GOOD, iteration=(1 << 62))),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_datagram_is_counted_and_never_reaches_a_sum(case: str) -> None:
    reason, make = HOSTILE[case]

    def feed(link: LossyLink, peers: dict[int, tuple[str, int]]) -> None:
        link.on_datagram(make(), peers[1])
        link.on_datagram(chunk(GOOD, sender=2), peers[2])  # one good packet after it

    inbox, _ = run_link(feed)
    assert inbox.dropped[reason] == 1, dict(inbox.dropped)
    assert sum(inbox.dropped.values()) == 1, dict(inbox.dropped)
    slot = inbox.take(Phase.GRADIENT, 0)
    assert slot.received == 1 and slot.sums[(0, 0)].tolist() == GOOD.tolist()


def test_foreign_addresses_and_claimed_ranks_are_dropped() -> None:
    def feed(link: LossyLink, peers: dict[int, tuple[str, int]]) -> None:
        link.on_datagram(chunk(GOOD, sender=1), (HOST, 9))  # an address outside the run
        link.on_datagram(chunk(GOOD, sender=2), peers[1])  # rank 1's address claiming rank 2
        link.on_datagram(chunk(GOOD, sender=0), peers[0])  # my own rank, from my own address: not a peer

    inbox, _ = run_link(feed)
    assert inbox.dropped["foreign"] == 3
    assert inbox.take(Phase.GRADIENT, 0).received == 0


def test_duplicates_and_late_packets_are_counted_but_delivered_once() -> None:
    def feed(link: LossyLink, peers: dict[int, tuple[str, int]]) -> None:
        good = chunk(GOOD, sender=1)
        link.on_datagram(good, peers[1])
        link.on_datagram(good, peers[1])
        link.inbox.take(Phase.GRADIENT, 0)
        link.on_datagram(chunk(GOOD, sender=2), peers[2])  # iteration 0 closed: late

    inbox, link = run_link(feed)
    assert (inbox.dropped["duplicate"], inbox.dropped["late"], inbox.stored) == (1, 1, 1)
    assert link.counters[1].messages_received == 2 and link.counters[2].messages_received == 1  # they crossed


def test_a_real_socket_outside_the_run_is_foreign() -> None:
    async def main() -> Inbox:
        socks = [bind(HOST, 0) for _ in range(WORKERS)]
        peers = {r: (HOST, int(s.getsockname()[1])) for r, s in enumerate(socks)}
        inbox = Inbox(LAYOUT, rank=0, resync=True)
        link = LossyLink(rank=0, peers=peers, layout=LAYOUT, inbox=inbox, resync=True, sock=socks[0])
        await link.start()
        stranger = bind(HOST, 0)
        try:
            stranger.sendto(chunk(GOOD, sender=1), peers[0])
            for _ in range(200):  # until the loop has read it (no sleep standing in for work: poll the count)
                if inbox.dropped["foreign"]:
                    break
                await asyncio.sleep(0.005)
        finally:
            stranger.close()
            await link.close()
            for s in socks[1:]:
                s.close()
        return inbox

    assert asyncio.run(main()).dropped["foreign"] == 1


def test_random_mutations_never_raise_or_poison_a_sum() -> None:
    rng = random.Random(13)
    valid = encode_packets(LAYOUT, GOOD, phase=Phase.GRADIENT, shard=0, iteration=0, sender=1)[0]

    fed = 0

    def feed(link: LossyLink, peers: dict[int, tuple[str, int]]) -> None:
        nonlocal fed
        for _ in range(3000):
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                kind = rng.random()
                if kind < 0.6 and data:
                    data[rng.randrange(len(data))] = rng.randrange(256)
                elif kind < 0.8 and data:
                    del data[rng.randrange(len(data)):]
                else:
                    data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            if bytes(data) != valid:
                link.on_datagram(bytes(data), peers[1])
                fed += 1
        link.on_datagram(valid, peers[1])

    inbox, _ = run_link(feed)
    assert set(inbox.dropped) == set(DROP_REASONS)
    assert sum(inbox.dropped.values()) == fed > 2900, dict(inbox.dropped)  # every mutation dropped and counted
    assert inbox.stored == 1
    slot = inbox.take(Phase.GRADIENT, 0)
    assert slot.received == 1 and np.array_equal(slot.sums[(0, 0)], GOOD.numpy().astype(np.float64))
