"""lossy_sgd trained in process over loopback UDP (real sockets, one event loop).

Without loss every worker ends bit-identical and equal to centralised SGD on the mean gradient. With a
seeded drop hook in the test's link (the protocol itself never drops), every datagram is accounted for:
what a receiver counts from a peer is what the peer sent minus what the hook dropped, and every one of them
was either stored or counted late. Waits are generous so that a loaded machine changes nothing but time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from squall.protocols.lossy_sgd.inbox import Inbox
from squall.protocols.lossy_sgd.link import LossyLink, bind
from squall.protocols.lossy_sgd.options import LossyOptions
from squall.protocols.lossy_sgd.packets import Layout, datagram_bytes
from squall.protocols.lossy_sgd.trainer import LossyTrainer
from squall.training.config import RunConfig
from squall.training.optim import Sgd
from squall.training.run import TrainResult

HOST = "127.0.0.1"
#: no loss: every wait ends when complete, so these only bound a stuck run
PATIENT = LossyOptions(deadline_s=5.0, spread_s=10.0, max_wait_s=20.0)


class DroppingLink(LossyLink):
    """The test's loss: drops each outgoing datagram with probability ``p`` (seeded), counting per peer."""

    def __init__(self, *args: Any, p: float, seed: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.p, self.rng = p, random.Random(seed)
        self.hook_dropped = dict.fromkeys(self.peers, 0)

    def send(self, peer: int, datagrams: Sequence[bytes]) -> None:
        kept = [d for d in datagrams if self.rng.random() >= self.p]
        self.hook_dropped[peer] += len(datagrams) - len(kept)
        self.counters[peer].messages_sent += len(datagrams) - len(kept)  # sent, then lost on the "link"
        super().send(peer, kept)


def config(steps: int) -> RunConfig:
    return RunConfig.from_json({"task": "mlp_digits", "task_args": {"hidden": 16}, "steps": steps, "lr": 0.2,
                                "eval_every": steps, "seed": 5, "batch_size": 16})


def train(workers: int, steps: int, options: LossyOptions, *, p: float = 0.0
          ) -> tuple[list[TrainResult], list[LossyTrainer], list[DroppingLink], list[list[dict[str, Any]]]]:
    cfg = config(steps)
    records: list[list[dict[str, Any]]] = [[] for _ in range(workers)]

    async def main() -> tuple[list[TrainResult], list[LossyTrainer], list[DroppingLink]]:
        socks = [bind(HOST, 0) for _ in range(workers)]
        peers = {r: (HOST, int(s.getsockname()[1])) for r, s in enumerate(socks)}
        task = cfg.build_task()
        layout = Layout.for_datagram(task.dim, workers, datagram_bytes(1500))
        links, trainers = [], []
        for r in range(workers):
            inbox = Inbox(layout, rank=r, resync=options.resync, window=options.window)
            link = DroppingLink(rank=r, peers=peers, layout=layout, inbox=inbox, resync=options.resync,
                                sock=socks[r], p=p, seed=100 + r)
            await link.start()
            links.append(link)
            trainers.append(LossyTrainer(cfg.build_task(), link, cfg.loop, options, optimizer=Sgd(cfg.sgd),
                                         write=lambda r=r, **f: records[r].append(f)))
        try:
            results = await asyncio.gather(*(t.run() for t in trainers))
            for _ in range(500):  # datagrams still in the sockets' buffers: let the loop read them (poll, <= 5 s)
                if all(links[j].counters[i].messages_received == links[i].counters[j].messages_sent
                       - links[i].hook_dropped[j] for j in range(workers) for i in links[j].peers):
                    break
                await asyncio.sleep(0.01)
        finally:
            for link in links:
                await link.close()
        return list(results), trainers, links

    results, trainers, links = asyncio.run(main())
    return results, trainers, links, records


def centralised(workers: int, steps: int) -> torch.Tensor:
    """SGD on the mean of every rank's minibatch gradient (what lossless lossy_sgd must compute)."""
    cfg = config(steps)
    task = cfg.build_task()
    streams = [task.batches(r, workers, cfg.loop.seed, cfg.loop.batch_size) for r in range(workers)]
    x = task.init_params(cfg.loop.seed).to(torch.float32)
    for t in range(steps):
        grads = torch.stack([task.loss_and_grad(x, next(s))[1].double() for s in streams])
        x = x - cfg.loop.lr(t) * grads.mean(0).float()
    return x


def test_without_loss_every_worker_ends_identical_and_equal_to_centralised_sgd() -> None:
    workers, steps = 4, 12
    results, trainers, _, records = train(workers, steps, replace(PATIENT, drift_every=3))
    assert len({r.fingerprint.hash for r in results}) == 1
    assert torch.allclose(results[0].params, centralised(workers, steps), atol=1e-5)
    for trainer in trainers:
        summary = trainer.summary()
        assert summary["missed_fraction"] == 0.0
        assert all(summary[f"dropped_{k}"] == 0 for k in ("malformed", "foreign", "not_mine", "future", "duplicate"))
        assert [t for t, _ in trainer.drift_history] == [0, 3, 6, 9]
        assert all(d == 0.0 for _, d in trainer.drift_history)
    steps_recorded = [rec["step"] for rec in records[0] if "step" in rec]
    assert steps_recorded == list(range(steps + 1))


def test_without_resync_and_without_loss_the_copies_stay_identical() -> None:
    results, _, _, _ = train(3, 8, replace(PATIENT, resync=False))
    assert len({r.fingerprint.hash for r in results}) == 1
    assert torch.allclose(results[0].params, centralised(3, 8), atol=1e-5)


def test_with_loss_every_datagram_is_accounted_for() -> None:
    workers, steps, p = 3, 16, 0.2
    options = LossyOptions(drift_every=1, deadline_s=0.05, spread_s=1.0, max_wait_s=5.0)
    results, trainers, links, _ = train(workers, steps, options, p=p)
    assert all(r.steps == steps for r in results)
    hook = sum(sum(link.hook_dropped.values()) for link in links)
    assert hook > 0
    for j, link in enumerate(links):
        for i in link.peers:
            sent, dropped = links[i].counters[j].messages_sent, links[i].hook_dropped[j]
            assert link.counters[i].messages_received == sent - dropped, (i, j)
        summary = trainers[j].summary()
        received = sum(c.messages_received for c in link.counters.values())
        assert summary["stored_packets"] + summary["dropped_late"] + summary["dropped_duplicate"] == received
        assert summary["dropped_malformed"] == summary["dropped_foreign"] == summary["dropped_not_mine"] == 0
    missed = [t.summary()["missed_fraction"] for t in trainers]
    assert all(0 < m < 0.6 for m in missed), missed
    stale = [t.last.get("stale_coords") for t in trainers]
    assert all(s is not None and s >= 0 for s in stale)
    assert any(d > 0 for t in trainers for _, d in t.drift_history)  # a missed broadcast shows as drift
