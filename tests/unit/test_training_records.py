"""One record format: every training loop's metrics records follow the shared schema and parse alike.

Each training protocol runs a few steps in process (the lock-step loop that the all-reduce family,
gossip, PS and MATCHA run; the gloo baseline, which runs that loop over torch.distributed;
SwarmSGD's driver; Moshpit SGD's loop). Their records must carry the same fields, apart from the
protocol's own ``stats()`` fields, and :mod:`squall.run_trace` must read the same values from each.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from squall.job import JobContext, JobSpec, MetricsWriter
from squall.protocols.moshpit import MoshpitAverager
from squall.protocols.moshpit.options import MoshpitOptions
from squall.protocols.moshpit.sgd import MoshpitTrainer
from squall.protocols.swarm import SwarmOptions, SwarmTrainer
from squall.run_trace import RECORD_FIELDS, build_trace, load_jsonl
from squall.training.algorithms.base import Algorithm
from squall.training.fingerprint import Projector
from squall.training.loop import train
from squall.training.optim import LrSchedule, Sgd
from squall.training.run import LoopConfig, SchemaError, TrainResult, step_record
from squall.training.run.records import RESERVED
from squall.training.tasks import make_task
from squall.training.vote import TransportVote
from squall.transport import InProcHub, Transport, inproc_mesh
from squall.wire import Message

STEPS = 8
EVAL_EVERY = 4
CONFIG = LoopConfig(lr=LrSchedule(0.5), steps=STEPS, eval_every=EVAL_EVERY)
MEAN_TAG = 0x5C4E
#: Fields of every step record after step 0, whatever the protocol (its stats() and scores aside).
STEP_SCHEMA = {
    "step", "elapsed_s", "lr", "loss", "compute_s", "sleep_s", "comm_s", "step_s",
    "bytes_sent", "bytes_received", "messages_sent", "messages_received", "param_hash", "norm", "projection",
}
#: Fields of every end record (the summary), the protocol's final stats aside.
END_SCHEMA = {
    "event", "rank", "steps", "stopped_by", "elapsed_s", "final_eval", "last_loss", "target_step", "compute_s",
    "sleep_s", "comm_s", "eval_s", "vote_s", "bytes_sent", "bytes_received", "messages_sent", "messages_received",
    "param_hash", "norm", "projection",
}
EVAL_FIELDS = {"eval_loss", "accuracy"}  # logreg_digits' scores: loss and accuracy


@dataclass(frozen=True)
class Run:
    """What one protocol's ranks wrote."""

    records: list[list[dict[str, Any]]]  # per rank, in order, with the writer's "wall"
    stats: set[str]  # the protocol's own fields (its stats() hook)
    final: set[str]  # the protocol's own fields of the end record


def sink(out: list[dict[str, Any]]) -> Callable[..., None]:
    """A metrics sink that adds ``wall`` as the job's MetricsWriter does."""
    return lambda **fields: out.append({"wall": time.time(), **fields})


class Mean(Algorithm):
    """Local SGD step, then the exact mean over every rank (all-to-all, summed in rank order)."""

    def __init__(self, transport: Transport) -> None:
        super().__init__()
        self.transport = transport
        self.rounds = 0

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        x, t = self.optimizer.update(params, grad, lr), self.transport
        for peer in t.peers:
            await t.send(peer, Message.of_tensor(x, round=k, tag=MEAN_TAG))
        parts = {t.rank: x}
        for peer in t.peers:
            msg = await t.recv(peer, tag=MEAN_TAG, round=k)
            assert msg.tensor is not None
            parts[peer] = msg.tensor
        self.rounds += 1
        return sum((parts[r] for r in sorted(parts)), torch.zeros_like(x)) / t.world_size

    def stats(self) -> dict[str, float]:
        return {"mean_rounds": self.rounds}


def lockstep() -> Run:
    world, task = 2, make_task("logreg_digits")
    records: list[list[dict[str, Any]]] = [[] for _ in range(world)]

    async def main() -> list[TrainResult]:
        transports = inproc_mesh(world)
        return list(await asyncio.gather(*(
            train(task, Mean(t), CONFIG, rank=t.rank, world_size=world, traffic=t.total_counters,
                  vote=TransportVote(t), write=sink(records[t.rank]))
            for t in transports
        )))

    results = asyncio.run(main())
    assert all(r.steps == STEPS for r in results)
    return Run(records, {"mean_rounds"}, {"mean_rounds"})


def swarm() -> Run:
    world, task = 3, make_task("logreg_digits")
    records: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    options = SwarmOptions(topology="ring", local_steps=2)

    async def main() -> list[SwarmTrainer]:
        transports = inproc_mesh(world)
        trainers = [SwarmTrainer(task, t, CONFIG, options, write=sink(records[t.rank])) for t in transports]
        await asyncio.gather(*(tr.run() for tr in trainers))
        for t in transports:
            await t.close()
        return trainers

    trainers = asyncio.run(main())
    stats = set(trainers[0].node.stats())
    return Run(records, stats, stats)


def moshpit() -> Run:
    world, task = 2, make_task("logreg_digits")
    records: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    options = MoshpitOptions(group_size=2, local_steps=2, heartbeat_s=0.05, peer_timeout_s=0.4, matchmaking_s=0.3,
                             sender_timeout_s=0.3, reducer_timeout_s=0.6, join_timeout_s=0.2, late_after_s=0.3)
    hub = InProcHub(world, latency=0.001)

    async def peer(rank: int) -> MoshpitTrainer:
        averager = MoshpitAverager(hub.endpoints[rank], grid=options.grid(world), config=options.averager(), seed=rank)
        trainer = MoshpitTrainer(task, averager, options, CONFIG, optimizer=Sgd(), write=sink(records[rank]))
        await averager.start()
        try:
            await trainer.join()
            await trainer.run()
        finally:
            await averager.close()
        return trainer

    async def main() -> list[MoshpitTrainer]:
        return list(await asyncio.gather(*(peer(r) for r in range(world))))

    trainers = asyncio.run(main())
    stats = set(trainers[0].stats())
    return Run(records, stats, stats | {"joined_late", "round_median_s"})


def gloo(tmp_path: Path) -> Run:
    """The gloo baseline on one process (a world of one: the loop and writer are what is tested)."""
    from squall.protocols.baselines.gloo import gloo_train

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = {"steps": STEPS, "lr": 0.5, "eval_every": EVAL_EVERY, "port": port, "algorithm": "local_sgd"}
    spec = JobSpec(job_id="t", entry="gloo_train", rank=0, world_size=1, peers=("127.0.0.1",),
                   out_dir=str(tmp_path), config=config, seed=0, deadline_s=60.0)
    with MetricsWriter(tmp_path / "metrics.jsonl") as metrics:
        gloo_train(JobContext(spec=spec, out_dir=tmp_path, metrics=metrics, started=time.monotonic()))
    return Run([load_jsonl(tmp_path / "metrics.jsonl")], {"averages"}, {"averages"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return {"lockstep": lockstep(), "swarm": swarm(), "moshpit": moshpit(),
            "gloo": gloo(tmp_path_factory.mktemp("gloo"))}


def own_fields(rec: Mapping[str, Any], run: Run) -> set[str]:
    """A record's fields, less the writer's clock, the protocol's stats and the evaluation scores."""
    return set(rec) - {"t", "wall"} - run.stats - EVAL_FIELDS


@pytest.mark.parametrize("protocol", ["lockstep", "swarm", "moshpit", "gloo"])
def test_every_training_loop_writes_the_one_record_schema(runs: dict[str, Run], protocol: str) -> None:
    run = runs[protocol]
    for rank_records in run.records:
        steps = [r for r in rank_records if "step" in r]
        assert [r["step"] for r in steps] == list(range(STEPS + 1)), protocol
        assert own_fields(steps[0], run) == STEP_SCHEMA - {"lr", "loss", "compute_s", "sleep_s", "comm_s", "step_s"}
        for rec in steps[1:]:
            assert own_fields(rec, run) == STEP_SCHEMA, (protocol, rec)
            assert set(rec) >= run.stats, (protocol, rec)
        evaluated = {r["step"] for r in steps if set(r) >= EVAL_FIELDS}
        assert evaluated == {0, EVAL_EVERY, STEPS}, protocol
        assert all(set(RECORD_FIELDS) <= set(r) for r in steps if r["step"] in evaluated and r["step"]), protocol
        end = rank_records[-1]
        assert end["event"] == "end" and "step" not in end and end["steps"] == STEPS, (protocol, end)
        assert set(end) - {"t", "wall"} - run.final == END_SCHEMA, (protocol, sorted(end))
        assert run.final <= set(end)


@pytest.mark.parametrize("protocol", ["lockstep", "swarm", "moshpit", "gloo"])
def test_the_trace_reads_the_same_fields_from_every_training_loop(runs: dict[str, Run], protocol: str) -> None:
    per_worker = runs[protocol].records
    start = min(rec["wall"] for recs in per_worker for rec in recs)
    trace = build_trace(protocol=protocol, profile="inproc", seed=0, backend="none", per_worker=per_worker,
                        start_wall=start)
    assert len(trace.records) == len(per_worker) * (STEPS + 1)
    for worker, recs in enumerate(per_worker):
        written = {r["step"]: r for r in recs if "step" in r}
        for parsed in trace.of(worker):
            rec = written[parsed.step]
            assert parsed.t == pytest.approx(rec["wall"] - start)  # t = 0: the first step record
            assert parsed.loss == rec.get("loss") and parsed.eval_loss == rec.get("eval_loss")
            assert parsed.accuracy == rec.get("accuracy") and parsed.bytes_sent == rec["bytes_sent"]
            assert parsed.projection == tuple(rec["projection"]) and len(parsed.projection) == CONFIG.projection_dim
            assert parsed.param_hash == rec["param_hash"] and len(parsed.param_hash) == 16
            assert parsed.norm == rec["norm"] is not None
            assert (parsed.loss is None) == (parsed.step == 0)
            assert (parsed.eval_loss is not None) == (parsed.accuracy is not None) == (parsed.step % EVAL_EVERY == 0)


def test_protocol_fields_may_not_shadow_the_schema() -> None:
    fp = Projector(4, 2).fingerprint(torch.zeros(4))
    rec = step_record(3, elapsed_s=1.0, fields={"loss": 0.5, "eval_loss": 0.4}, traffic=None, fingerprint=fp,
                      stats={"averages": 2})
    assert rec["step"] == 3 and rec["averages"] == 2 and rec["eval_loss"] == 0.4 and "bytes_sent" not in rec
    for clash in ("loss", "bytes_sent", "param_hash", "steps", "event"):
        assert clash in RESERVED
        with pytest.raises(SchemaError, match=clash):
            step_record(3, elapsed_s=1.0, fields={}, traffic=None, fingerprint=fp, stats={clash: 1})
    with pytest.raises(SchemaError, match="round"):  # protocol fields go through stats(), not the step's fields
        step_record(3, elapsed_s=1.0, fields={"round": 1}, traffic=None, fingerprint=fp, stats={})
