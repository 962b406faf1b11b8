"""Moshpit SGD in one event loop: convergence, a peer killed and restarted mid-run, stopping without a vote."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from squall.protocols.moshpit import MoshpitAverager
from squall.protocols.moshpit.options import MoshpitOptions
from squall.protocols.moshpit.sgd import MoshpitTrainer
from squall.training.device import DeviceModel
from squall.training.loop import LoopConfig, Target
from squall.training.optim import LrSchedule, Sgd
from squall.training.tasks import make_task
from squall.transport import InProcHub

OPTIONS = MoshpitOptions(
    group_size=2,
    local_steps=4,
    heartbeat_s=0.05,
    peer_timeout_s=0.4,
    matchmaking_s=0.5,
    sender_timeout_s=0.3,
    reducer_timeout_s=0.6,
    join_timeout_s=0.3,
    late_after_s=0.3,
)
ACCURACY = 0.9  # logreg on digits reaches ~0.95


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Several peers share one loop: one intra-op thread keeps each step short."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Peers:
    """Trainers on one in-process hub."""

    def __init__(self, n: int, loop: LoopConfig, options: MoshpitOptions, *, step_time_s: float | None = 0.01) -> None:
        self.hub = InProcHub(n, latency=0.001)
        self.loop, self.options = loop, options
        self.step_time_s = step_time_s  # emulated compute per step (None: no device model)
        self.task = make_task("logreg_digits")
        self.records: dict[int, list[dict[str, Any]]] = {r: [] for r in range(n)}

    def trainer(self, rank: int) -> MoshpitTrainer:
        averager = MoshpitAverager(
            self.hub.endpoints[rank],
            grid=self.options.grid(self.hub.world_size),
            config=self.options.averager(),
            seed=rank,
        )
        return MoshpitTrainer(
            self.task,
            averager,
            self.options,
            self.loop,
            optimizer=Sgd(),
            device=None if self.step_time_s is None else DeviceModel(node=rank, step_time_s=self.step_time_s),
            write=lambda **fields: self.records[rank].append(fields),
        )

    async def run(self, trainer: MoshpitTrainer) -> dict[str, Any]:
        await trainer.averager.start()
        try:
            await trainer.join()
            return await trainer.run()
        finally:
            await trainer.averager.close()


def test_peers_train_to_the_target_and_stop_together_without_a_vote() -> None:
    loop = LoopConfig(lr=LrSchedule(0.5), seconds=20.0, eval_every=4, target=Target("accuracy", ACCURACY))
    peers = Peers(4, loop, OPTIONS)

    async def main() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(peers.run(peers.trainer(r)) for r in range(4))))

    results = asyncio.run(main())
    assert all(r["stopped_by"] == "target" and r["target_step"] is not None for r in results), results
    assert all(r["rounds_ok"] >= 3 for r in results)
    assert max(r["elapsed_s"] for r in results) < 10
    middle = [rec for r in range(4) for rec in peers.records[r] if rec.get("step") == 20]
    assert len(middle) == 4 and all(rec["alive"] == 4 for rec in middle)  # nobody dropped out on the way
    stops = [peers.records[r][-1]["elapsed_s"] for r in range(4)]
    assert max(stops) - min(stops) < 1.0  # they stopped together: each once everyone it saw had reached


def test_a_killed_peer_is_dropped_and_its_restarted_process_rejoins_and_converges() -> None:
    loop = LoopConfig(lr=LrSchedule(0.5), seconds=3.0, eval_every=4)
    peers = Peers(4, loop, OPTIONS)

    views_while_down: list[set[int]] = []

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        victim = asyncio.ensure_future(peers.run(peers.trainer(3)))
        trainers = [peers.trainer(r) for r in range(3)]
        others = [asyncio.ensure_future(peers.run(t)) for t in trainers]
        await asyncio.sleep(0.6)
        peers.hub.kill(3)  # SIGKILL: no goodbye, traffic to it vanishes
        victim.cancel()
        await asyncio.gather(victim, return_exceptions=True)
        await asyncio.sleep(0.8)  # twice the peer timeout
        # each survivor's view just before the restart: a silent peer is dropped once the timeout has
        # passed, however the survivors' steps and rounds were spread over the wait
        views_while_down.extend(set(t.averager.membership.alive(t.clock())) for t in trainers)
        peers.hub.revive(3)
        restarted = await peers.run(peers.trainer(3))
        return list(await asyncio.gather(*others)), restarted

    survivors, restarted = asyncio.run(main())
    assert all(r["final_eval"]["accuracy"] >= ACCURACY for r in survivors), [r["final_eval"] for r in survivors]
    # it averaged with the swarm again: at least one round completed (it overlaps the others for
    # about 1.5 s, and a late joiner's first rounds may wait out a matchmaking window, so more than
    # one is not guaranteed on a loaded host)
    assert restarted["joined_late"] and restarted["rounds_ok"] >= 1, restarted
    assert restarted["final_eval"]["accuracy"] >= ACCURACY
    first = next(rec for rec in peers.records[3][::-1] if rec.get("step") is not None and rec["step"] > 0)
    assert first["step"] > 40  # it continued from the downloaded step, not from 0
    # rank 3 left every survivor's view while it was down, and rank 0 still saw the other two. Read
    # from the views themselves: rank 0's step records in a fixed 0.3 s window were empty once on a
    # loaded host, its steps waiting out a round with the dead peer.
    assert all(3 not in view for view in views_while_down) and views_while_down[0] == {1, 2}, views_while_down


def test_without_emulated_compute_time_the_steps_still_leave_room_for_averaging() -> None:
    # Steps that never wait (no device model) must not starve the rounds and heartbeats that share
    # their event loop: before the fix, every peer trained alone and timed the others out.
    loop = LoopConfig(lr=LrSchedule(0.5), seconds=2.0, eval_every=50)
    peers = Peers(4, loop, OPTIONS, step_time_s=None)

    async def main() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(peers.run(peers.trainer(r)) for r in range(4))))

    results = asyncio.run(main())
    assert all(r["rounds_ok"] >= 5 for r in results), [(r["rounds_ok"], r["rounds_skipped"]) for r in results]
    # mid-run (the first peers to finish leave the others' views at the end)
    middle = [rec["alive"] for r in range(4) for rec in peers.records[r]
              if 0.8 < rec.get("elapsed_s", 0) < 1.5 and "alive" in rec]
    assert middle and min(middle) == 4  # nobody timed anybody out
