"""Non-blocking SGD with in-process ranks: the weighting maths, sample accounting, stale signals, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from squall.gossip.graphs import build_graph, mixing_matrix
from squall.gossip.matchings import matcha_mixer
from squall.gossip.sgd import GossipSGD
from squall.protocols.nonblocking.job import trainer_for
from squall.protocols.nonblocking.ledger import SampleLedger
from squall.protocols.nonblocking.options import NonblockingOptions
from squall.protocols.nonblocking.protocol import DECLARATIONS, DPSGD, GRAPH_MIXER, MATCHA, MATCHA_MIXER, NAMES, RING
from squall.protocols.nonblocking.signals import SIGNAL_TAG, FinishSignals
from squall.protocols.nonblocking.sync import RingSync, build_gossip_sync
from squall.protocols.nonblocking.trainer import NonBlockingTrainer
from squall.training.config import RunConfig
from squall.training.declaration import Declaration
from squall.training.microbatch import accumulate
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import TrainResult
from squall.training.tasks import make_task
from squall.training.tasks.base import Batch, SupervisedTask
from squall.transport import PeerFailed, Transport, TransportError, inproc_mesh
from squall.wire import Message

LR = 0.25
DIM = 5


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model's compute is 50x slower with two threads on a loaded 2-core host."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def declared_config(name: str, **overrides: Any) -> RunConfig:
    """The run config of the declared protocol ``name``, with the run's own keys."""
    (declaration,) = [d for d in DECLARATIONS if isinstance(d, Declaration) and d.name == name]
    return RunConfig.from_json({**declaration.config, **overrides})


def hand_made(world: int) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    """Shared parameters, per-rank gradient sums and micro-batch counts (rank 1 finished none)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(DIM, generator=gen)
    done = [4, 0, 1, 3, 2, 4][:world]
    sums = [torch.randn(DIM, generator=gen) * d for d in done]
    return x, sums, done


def test_ring_sync_is_the_count_weighted_mean_on_every_rank() -> None:
    world = 4
    x, sums, done = hand_made(world)
    transports = inproc_mesh(world)

    async def main() -> list[tuple[torch.Tensor, int]]:
        return await asyncio.gather(*(RingSync(t).step(3, x, sums[t.rank], done[t.rank], LR) for t in transports))

    out = asyncio.run(main())
    expected = x - LR * torch.stack(sums).sum(0) / sum(done)
    for params, used in out:
        assert used == sum(done) == 8
        torch.testing.assert_close(params, expected)
    assert len({p.numpy().tobytes() for p, _ in out}) == 1  # bit-identical
    # Not the mean of the per-rank means (which would weigh rank 2's single micro-batch like rank 0's four).
    per_rank = torch.stack([s / d for s, d in zip(sums, done, strict=True) if d]).mean(0)
    assert not torch.allclose(out[0][0], x - LR * per_rank)


def test_gossip_sync_steps_with_its_own_mean_then_mixes_as_dpsgd() -> None:
    world = 4
    x, sums, done = hand_made(world)
    transports = inproc_mesh(world)

    async def main() -> list[tuple[torch.Tensor, int]]:
        syncs = [build_gossip_sync(t, Sgd(), GRAPH_MIXER, {"topology": "ring"}) for t in transports]
        return await asyncio.gather(*(s.step(0, x, sums[s_rank], done[s_rank], LR)
                                      for s_rank, s in enumerate(syncs)))

    out = asyncio.run(main())
    w = torch.from_numpy(mixing_matrix(build_graph("ring", world), "metropolis")).float()
    local = torch.stack([x - LR * s / d if d else x for s, d in zip(sums, done, strict=True)])
    expected = w @ local
    for rank, (params, used) in enumerate(out):
        assert used == done[rank]
        torch.testing.assert_close(params, expected[rank])


def test_gossip_sync_with_the_matcha_mixer_matches_matcha_itself() -> None:
    world = 6
    x, sums, done = hand_made(world)
    grads = [s / d if d else torch.zeros(DIM) for s, d in zip(sums, done, strict=True)]
    args: dict[str, Any] = {"topology": "ring", "budget": 0.5}

    async def ours() -> list[torch.Tensor]:
        ts = inproc_mesh(world)
        syncs = [build_gossip_sync(t, Sgd(), MATCHA_MIXER, args) for t in ts]
        out = []
        for k in range(3):  # several iterations: the activated matchings change with k
            out = [p for p, _ in await asyncio.gather(*(s.step(k, x, sums[r], done[r], LR)
                                                       for r, s in enumerate(syncs)))]
        return out

    async def theirs() -> list[torch.Tensor]:
        ts = inproc_mesh(world)
        algos = [GossipSGD(matcha_mixer(t, **args), optimizer=Sgd()) for t in ts]
        out = []
        for k in range(3):
            out = await asyncio.gather(*(a.step(k, x, grads[r], LR) for r, a in enumerate(algos)))
        return list(out)

    for a, b in zip(asyncio.run(ours()), asyncio.run(theirs()), strict=True):
        assert torch.equal(a, b)


def test_a_missing_mixer_is_refused_with_its_reference() -> None:
    (t,) = inproc_mesh(1)
    with pytest.raises(ValueError, match=r"squall\.gossip\.sgd:no_such_mixer"):
        build_gossip_sync(t, Sgd(), "squall.gossip.sgd:no_such_mixer", {})
    with pytest.raises(ValueError, match="mixer_args"):
        build_gossip_sync(t, Sgd(), GRAPH_MIXER, {"colour": "red"})


@pytest.mark.parametrize(("args", "key"), [
    ({"microbatches": 0}, "microbatches=0"),
    ({"sync": "star"}, "sync='star'"),
    ({"mixer": "graph_mixer"}, "mixer='graph_mixer'"),
    ({"timeout": -1}, "timeout=-1"),
    ({"bogus": 1}, "bogus"),
])
def test_options_name_the_bad_key_and_value(args: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key.replace("(", r"\(")):
        read_options(NonblockingOptions, args, where="nonblocking options")


def test_a_batch_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match=r"batch_size=30 is not a multiple of .*microbatches=4"):
        NonblockingOptions(microbatches=4).microbatch_size(30)


def test_three_declarations_with_paper_and_needs() -> None:
    declared = {d.name: d for d in DECLARATIONS if isinstance(d, Declaration)}
    assert set(declared) == set(NAMES) == {RING, DPSGD, MATCHA}
    for d in declared.values():
        assert "2211.00889" in d.paper and {"tcp", "device_model"} <= d.needs
        read_options(NonblockingOptions, d.config["algorithm_args"], where="nonblocking options")  # valid


# -- signals --------------------------------------------------------------------------------------


def test_a_stale_signal_is_ignored_and_an_early_one_waits_for_its_iteration() -> None:
    a, b = inproc_mesh(2)

    async def main() -> FinishSignals:
        signals = FinishSignals(a)
        signals.start()
        signals.begin(5)
        for round in (4, 3, 6):  # two late ones, one for the next iteration
            await b.send(0, Message.of_control({"microbatches": 4}, round=round, tag=SIGNAL_TAG))
        await b.send(0, Message.of_control({"microbatches": "many"}, round=5, tag=SIGNAL_TAG))
        while signals.stale + signals.malformed < 3 or not signals.arrived(6):
            await asyncio.sleep(0)
        assert not signals.arrived(5)
        # The compute phase of iteration 5 is not cut short by them.
        task = make_task("logreg_digits")
        batches = task.batches(0, 2, 0, 8)
        acc = await accumulate(task, task.init_params(0), batches, 4, step=5, stop=lambda _: signals.arrived(5))
        assert acc.done == 4
        signals.begin(6)
        assert signals.arrived(6) and signals.trigger(6) == 1
        await b.send(0, Message.of_control({"microbatches": 4}, round=6, tag=SIGNAL_TAG))  # a second one
        signals.begin(7)
        await signals.close()
        return signals

    signals = asyncio.run(main())
    assert signals.stale == 2 and signals.malformed == 1


def test_a_signal_stops_a_peer_between_micro_batches() -> None:
    """Rank 1 announces iteration 0 after rank 0's second micro-batch: rank 0 stops there, whole."""
    a, b = inproc_mesh(2)
    task = make_task("logreg_digits")

    async def main() -> int:
        signals = FinishSignals(a)
        signals.start()
        signals.begin(0)
        announcer = FinishSignals(b)
        seen: list[int] = []

        def stop(_elapsed: float) -> bool:
            seen.append(len(seen))
            return signals.arrived(0)

        ledger = SampleLedger(task.batches(0, 2, 0, 8))

        async def announce_after_two() -> None:
            while ledger.taken < 2:
                await asyncio.sleep(0)
            await announcer.announce(0, 4)

        acc, _ = await asyncio.gather(
            accumulate(task, task.init_params(0), ledger, 8, step=0, stop=stop), announce_after_two())
        await signals.close()
        assert ledger.taken == acc.done  # nothing taken that was not computed
        return acc.done

    done = asyncio.run(main())
    assert 2 <= done < 8


def test_a_signal_to_a_peer_that_already_left_is_not_an_error() -> None:
    a, b, c = inproc_mesh(3)

    async def main() -> FinishSignals:
        await c.close()  # finished its last iteration and left
        while 2 not in a.failed_peers:  # its goodbye has reached rank 0
            await asyncio.sleep(0)
        signals = FinishSignals(a)
        await signals.announce(9, 4)
        message = await b.recv(0, tag=SIGNAL_TAG, timeout=30)
        assert message.round == 9 and message.control == {"microbatches": 4}
        return signals

    signals = asyncio.run(main())
    assert signals.sent == 1 and signals.undelivered == 1 and signals.trigger(9) == 0


# -- the loop -------------------------------------------------------------------------------------


class ScriptedStops(FinishSignals):
    """Real signals, plus a forced stop of rank ``r`` in iteration ``k`` after ``limit(r, k)`` micro-batches."""

    def __init__(self, transport: Transport, ledger: SampleLedger, limit: Callable[[int, int], int]) -> None:
        super().__init__(transport)
        self.ledger, self.limit, self.start_taken = ledger, limit, 0

    def begin(self, iteration: int) -> None:
        super().begin(iteration)
        self.start_taken = self.ledger.taken

    def arrived(self, iteration: int) -> bool:
        forced = self.ledger.taken - self.start_taken >= self.limit(self.transport.rank, iteration)
        return forced or super().arrived(iteration)


def run_world(name: str, world: int, steps: int, *, batch_size: int, microbatches: int,
              limit: Callable[[int, int], int] | None = None,
              ) -> tuple[list[TrainResult], list[list[dict[str, Any]]], list[list[int]], list[int | None]]:
    """Train the declared protocol ``name`` on in-process ranks; results, records, sample indices seen."""
    args = dict(declared_config(name).algorithm_args, microbatches=microbatches)
    config = declared_config(name, steps=steps, batch_size=batch_size, lr=0.5, eval_every=steps,
                             algorithm_args=args)
    options = read_options(NonblockingOptions, config.algorithm_args, where="nonblocking options")
    transports = inproc_mesh(world)
    records: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    seen: list[list[int]] = [[] for _ in range(world)]
    epoch_sizes: list[int | None] = []
    trainers: list[NonBlockingTrainer] = []
    for t in transports:
        task = make_task("logreg_digits")
        assert isinstance(task, SupervisedTask)
        gather = task.gather

        def recording(indices: torch.Tensor, gather: Callable[[torch.Tensor], Batch] = gather,
                      out: list[int] = seen[t.rank]) -> Batch:
            out.extend(int(i) for i in indices)
            return gather(indices)

        task.gather = recording  # type: ignore[method-assign]
        trainer, epoch_size = trainer_for(task, t, config, options, rank=t.rank, world_size=world,
                                          write=lambda rank=t.rank, **f: records[rank].append(f))
        if limit is not None:
            trainer.signals = ScriptedStops(t, trainer.ledger, limit)
        trainers.append(trainer)
        epoch_sizes.append(epoch_size)

    async def main() -> list[TrainResult]:
        return list(await asyncio.gather(*(tr.run() for tr in trainers)))

    return asyncio.run(main()), records, seen, epoch_sizes


def assert_every_epoch_is_the_shard_once(seen: list[int], epoch_size: int, shard: set[int]) -> int:
    """Each full epoch of ``seen`` holds ``epoch_size`` distinct samples of ``shard``; returns full epochs."""
    epochs = len(seen) // epoch_size
    for e in range(epochs + 1):
        chunk = seen[e * epoch_size:(e + 1) * epoch_size]
        assert len(set(chunk)) == len(chunk), f"epoch {e}: a sample twice"
        assert set(chunk) <= shard
    return epochs


def test_forced_early_stops_lose_and_repeat_no_sample_over_epochs() -> None:
    world, b = 3, 4
    # rank r stops iteration k after (k + r) % (b + 1) micro-batches: 0..b, different on every rank
    results, records, seen, epoch_sizes = run_world(RING, world, 70, batch_size=64, microbatches=b,
                                                    limit=lambda r, k: (k + r) % (b + 1))
    task = make_task("logreg_digits")
    assert isinstance(task, SupervisedTask)
    for rank in range(world):
        size = epoch_sizes[rank]
        assert size is not None
        shard = {int(i) for i in task.shard(rank, world, 0)}
        assert size == len(shard) // 16 * 16  # whole micro-batches of 16; the partial rest is the stream's
        steps = [r for r in records[rank] if r.get("step", 0) > 0]
        done = [r["nb_microbatches"] for r in steps]
        assert len(done) == 70 and min(done) == 0 and max(done) == b  # early stops happened, full steps too
        stats = results[rank].stats
        assert stats["nb_samples"] == len(seen[rank]) == 16 * sum(done)
        epochs = assert_every_epoch_is_the_shard_once(seen[rank], size, shard)
        assert epochs >= 2 and stats["nb_epoch_sizes"] == [size] * epochs
        assert stats["nb_epoch"] == epochs and stats["nb_epoch_samples"] == len(seen[rank]) - epochs * size
    # The ring's update used every rank's micro-batches.
    for k in range(70):
        per_rank = [records[rank][k + 1]["nb_microbatches"] for rank in range(world)]
        assert records[0][k + 1]["step"] == k + 1
        assert records[0][k + 1]["nb_update_microbatches"] == sum(per_rank)
    assert len({r.fingerprint.hash for r in results}) == 1


@pytest.mark.parametrize("name", [RING, DPSGD, MATCHA])
def test_each_variant_learns_digits_and_someone_triggers_every_step(name: str) -> None:
    world = 4
    results, records, seen, _ = run_world(name, world, 120, batch_size=32, microbatches=4)
    for rank in range(world):
        accuracy = results[rank].final_eval["accuracy"]
        assert accuracy > 0.85, f"{name} rank {rank}: accuracy {accuracy:.3f}"
        steps = [r for r in records[rank] if r.get("step", 0) > 0]
        assert all(r["nb_triggered_by"] in range(world) for r in steps)
        assert results[rank].stats["nb_samples"] == len(seen[rank]) == 8 * sum(r["nb_microbatches"] for r in steps)
    triggered = sum(r.stats["nb_triggered_total"] for r in results)
    assert triggered >= 120  # every iteration was ended by a worker that finished its batch


def test_a_peer_gone_mid_run_fails_the_others_instead_of_hanging() -> None:
    world = 3
    config = declared_config(RING, steps=10_000, batch_size=32, lr=0.5, eval_every=10_000)
    options = read_options(NonblockingOptions, config.algorithm_args, where="nonblocking options")
    transports = inproc_mesh(world, default_timeout=30.0)
    task = make_task("logreg_digits")
    trainers = [trainer_for(task, t, config, options, rank=t.rank, world_size=world)[0] for t in transports]

    async def main() -> list[BaseException | TrainResult]:
        async def doomed() -> TrainResult:
            run = asyncio.create_task(trainers[2].run())
            while trainers[2].computed < 20:  # a few iterations in
                await asyncio.sleep(0)
            run.cancel()
            await transports[2].close()  # the worker is gone
            raise PeerFailed(2, "killed by the test")

        # wait_for guards the test run only; the failure must come from the transport, well before it
        return list(await asyncio.wait_for(
            asyncio.gather(trainers[0].run(), trainers[1].run(), doomed(), return_exceptions=True), 120))

    out = asyncio.run(main())
    assert all(isinstance(o, TransportError) for o in out[:2]), out
