"""One rank of DropCompute training: micro-batches until the threshold, one all-reduce, one update.

Why a job of its own rather than an ``Algorithm`` of the shared ``train`` loop: that loop computes
one gradient per step before calling the algorithm, while DropCompute's compute phase *is* the
method (M micro-batches, a timer, dropped data skipped). So this module runs its own lock-step
loop, modelled on :func:`squall.training.loop.train`, and hands everything around the steps
(evaluation, records, the stop vote, the result) to the shared
:class:`~squall.training.run.Driver` with :meth:`~squall.training.run.StopRules.lockstep`.

Step ``k`` on every rank::

    tau_k = tau if k >= min_drop_step else none                  # drop off for the first steps
    acc = accumulate(task, x, batches, M, stop=elapsed > tau_k)  # real compute + emulated device time
    drop(batches, M - acc.done)                                  # dropped data is skipped, not deferred
    [g_sum, done_sum] = ring all-reduce (sum) of [acc.grad, acc.done]   # one vector, one collective
    g = g_sum / (N M)    ("nominal": the paper code)   or   g_sum / done_sum   ("completed")
    x = sgd(x, g, lr(k))
    if tau is "auto" and k + 1 == threshold_step: gather every rank's micro-batch and all-reduce
        times (a second ring all-reduce of a zero-padded table) and pick tau with
        :func:`~squall.protocols.dropcompute.threshold.best_threshold`: every rank gets the same bits,
        so every rank picks the same tau.

Failure: a synchronous step needs every rank. A transport error in a step (a peer's connection
closed or reset, a heartbeat or deadline missed) ends training on this rank with
:class:`DropComputeError`, naming the step and every peer this rank knows to have failed, and
this rank first sends every peer an abort notice (:mod:`squall.protocols.dropcompute.abort`) saying so.
Every rank watches for notices while it trains and stops at once on one, with an error naming
the failed peers: a killed worker's neighbours see its connections break, and every other rank
learns it from them instead of waiting on a neighbour (the transports' closes would tell them
too, one hop at a time, naming only that neighbour).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from squall.collectives import ring_allreduce
from squall.protocols.dropcompute.abort import announce, blame, watch
from squall.protocols.dropcompute.options import DropComputeOptions
from squall.protocols.dropcompute.threshold import ThresholdEstimate, best_threshold
from squall.training.device import DeviceModel
from squall.training.microbatch import Accumulated, accumulate, drop
from squall.training.optim import Sgd
from squall.training.run import Driver, LoopConfig, MetricsSink, StopRules, TrainResult
from squall.training.tasks.base import Batch, Task
from squall.training.vote import Vote, local_vote
from squall.transport import Transport, TransportError, TransportTimeout

logger = logging.getLogger(__name__)

#: Message tags: the step's gradient all-reduce ("DCGR") and the threshold's timing table ("DCTH").
GRADIENT_TAG = 0x44434752
TIMING_TAG = 0x44435448
#: Seconds a rank whose step failed waits for a peer's abort notice that may say more (who failed first).
NOTICE_GRACE_S = 0.2


class DropComputeError(RuntimeError):
    """A synchronous step could not complete (a peer failed or missed a deadline)."""


def normalise(summed: torch.Tensor, completed_total: float, *, workers: int, micro_batches: int,
              mode: str) -> torch.Tensor:
    """The averaged gradient from the all-reduced sum of micro-batch gradients.

    ``nominal``: ``summed / (workers x micro_batches)`` (dropped micro-batches count as zero);
    ``completed``: ``summed / completed_total``, the mean over the micro-batches actually computed.
    """
    if mode == "nominal":
        return summed / (workers * micro_batches)
    if mode == "completed":
        if completed_total < 1:
            raise ValueError(f"no completed micro-batch to average over ({completed_total})")
        return summed / completed_total
    raise ValueError(f"unknown normalisation {mode!r}")


class DropComputeTrainer:
    """One rank's DropCompute training (see the module docstring).

    :param vote: stop agreement and start barrier (None: decide locally, one rank or steps only).
    :param clock: read by the compute timer, the step timings and the driver (tests pass a fake one).
    """

    def __init__(self, task: Task, transport: Transport, config: LoopConfig, options: DropComputeOptions, *,
                 device: DeviceModel | None = None, optimizer: Sgd | None = None, vote: Vote | None = None,
                 write: MetricsSink | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.task, self.transport, self.config, self.options = task, transport, config, options
        self.device, self.optimizer = device, optimizer or Sgd()
        self.vote, self.write, self.clock = vote or local_vote, write, clock
        self.x = task.init_params(config.seed)
        self.tau_s: float | None = options.fixed_tau_s  # the threshold once dropping is on
        self.chosen: ThresholdEstimate | None = None  # the automatic choice
        self.chosen_at: int | None = None
        # per step (index = step):
        self.completed: list[int] = []
        self.completed_total: list[int] = []
        self.step_times: list[float] = []
        self.tau_in_force: list[float | None] = []
        self.microbatch_s: list[float | None] = []  # mean time of the step's completed micro-batches
        self.microbatch_median_s: float | None = None  # of every rank's micro-batches the choice was made from
        self.consumed = 0  # micro-batches taken from the data stream (computed or dropped)
        self._samples: list[list[float]] = []  # per step before the automatic choice: M times + comm_s

    # -- the record fields ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """This step's protocol fields: drop rate, completed micro-batches (here, everywhere), tau in force."""
        if not self.completed:
            return {"drop_rate": None, "completed": None, "completed_total": None, "tau_s": None,
                    "microbatch_s": None}
        m = self.options.micro_batches
        return {
            "drop_rate": round(1 - self.completed[-1] / m, 6),
            "completed": self.completed[-1],
            "completed_total": self.completed_total[-1],
            "tau_s": self.tau_in_force[-1],
            "microbatch_s": self.microbatch_s[-1],
        }

    def summary(self) -> dict[str, Any]:
        """The end record's protocol fields: drop rates, step times, the threshold and its estimates."""
        opts, n, m = self.options, self.transport.world_size, self.options.micro_batches
        eligible = range(min(opts.min_drop_step, len(self.completed)), len(self.completed))
        settled = range(min(self._settled_from(), len(self.completed)), len(self.completed))
        times = [self.step_times[k] for k in settled]
        out: dict[str, Any] = {
            "micro_batches": m,
            "normalisation": opts.normalisation,
            "tau_mode": "auto" if opts.auto else ("off" if opts.tau is None else "fixed"),
            "tau_s": self.tau_s,
            "drop_rate": _ratio(sum(m - self.completed[k] for k in eligible), m * len(eligible)),
            "global_drop_rate": _ratio(sum(n * m - self.completed_total[k] for k in eligible), n * m * len(eligible)),
            "step_s_median": round(statistics.median(times), 6) if times else None,
            "step_s_mean": round(statistics.fmean(times), 6) if times else None,
            "step_times_s": [round(t, 6) for t in self.step_times],
            "completed_history": list(self.completed),
            "completed_total_history": list(self.completed_total),
            "microbatches_consumed": self.consumed,
        }
        est = self.chosen
        out.update({
            "threshold_chosen_at": self.chosen_at,
            "microbatch_s_median": self.microbatch_median_s,
            "predicted_step_speedup": None if est is None else round(est.step_ratio, 4),
            "predicted_drop_rate": None if est is None else round(est.drop_rate, 4),
            "effective_speedup_est": None if est is None else round(est.effective_ratio, 4),
            "effective_speedup_measured": self._measured_effective(),
        })
        return out

    def _settled_from(self) -> int:
        """First step with the final threshold in force (the steps the median step time is taken over)."""
        opts = self.options
        if opts.auto:
            return max(opts.min_drop_step, opts.threshold_step)
        return opts.min_drop_step

    def _measured_effective(self) -> float | None:
        """Completed samples per second after the automatic choice / before it (None without a choice)."""
        if self.chosen_at is None:
            return None
        before = self.step_times[1:self.chosen_at] or self.step_times[:self.chosen_at]
        after_steps = range(max(self.chosen_at + 1, self.options.min_drop_step), len(self.step_times))
        if not before or not after_steps:
            return None
        n, m = self.transport.world_size, self.options.micro_batches
        kept = sum(self.completed_total[k] for k in after_steps) / (n * m * len(after_steps))
        after = statistics.fmean(self.step_times[k] for k in after_steps)
        return round(kept * statistics.fmean(before) / after, 4)

    # -- training ---------------------------------------------------------------------------------
    async def run(self) -> TrainResult:
        """Train until a budget or the target stops every rank; returns this rank's result.

        :raises DropComputeError: a step failed here, or another rank announced that one failed there.
        """
        t, cfg = self.transport, self.config
        driver = Driver(self.task, StopRules.lockstep(cfg, self.vote), rank=t.rank, model=lambda: self.x,
                        write=self.write, traffic=t.total_counters, stats=self.stats, clock=self.clock)
        batches = self.task.batches(t.rank, t.world_size, cfg.seed, cfg.batch_size)
        training = asyncio.create_task(self._train(driver, batches), name=f"dropcompute-train-{t.rank}")
        watcher = asyncio.create_task(watch(t), name=f"dropcompute-abort-watch-{t.rank}")
        try:
            await asyncio.wait({training, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not training.done() and watcher.result() is None:  # no peer left to send a notice
                await asyncio.wait({training})
            if training.done() and training.exception() is None:
                return training.result()
            error = training.exception() if training.done() else None
            if error is not None and not isinstance(error, TransportError):
                raise error
            if not watcher.done():  # a notice sent before the connection that failed us closed is on its way
                await asyncio.wait({watcher}, timeout=NOTICE_GRACE_S)
            notice = watcher.result() if watcher.done() else None
            failed = {p: e.reason for p, e in t.failed_peers.items()}
            if isinstance(error, TransportTimeout) and error.peer is not None:
                failed.setdefault(error.peer, str(error))  # silent, not gone: still the one this rank waited for
            step = len(self.completed)
            if error is not None:
                await announce(t, step, str(error), failed)
                raise DropComputeError(f"rank {t.rank}: synchronous step {step} failed: {error}; "
                                       f"{blame(failed, notice)}") from error
            assert notice is not None  # the watcher ended first, with a notice
            training.cancel()
            await asyncio.gather(training, return_exceptions=True)
            await announce(t, step, notice.error, {**failed, **notice.failed})  # forwarded as it came
            raise DropComputeError(f"rank {t.rank}: synchronous step {step} aborted by rank {notice.sender}: "
                                   f"{notice.error}; {blame(failed, notice)}")
        finally:
            for task in (training, watcher):
                task.cancel()
            await asyncio.gather(training, watcher, return_exceptions=True)

    async def _train(self, driver: Driver, batches: Iterator[Batch]) -> TrainResult:
        """The lock-step loop (a transport error propagates to :meth:`run`)."""
        done = 0
        await self.vote(0, False)  # start barrier
        stopped_by = await driver.begin()
        while stopped_by is None:
            fields = await self.step(done, batches, driver)
            done += 1
            stopped_by = await driver.after_step(done, fields)
        return await driver.finish(done, stopped_by, stats=self.summary())

    def stop_rule(self, k: int) -> Callable[[float], bool] | None:
        """The compute timer of step ``k``: stop once the elapsed time passes tau (None: never)."""
        tau = self.tau_s
        if tau is None or k < self.options.min_drop_step:
            return None
        return lambda elapsed: elapsed > tau

    async def step(self, k: int, batches: Iterator[Batch], driver: Driver) -> dict[str, Any]:
        """Step ``k`` (see the module docstring); returns its record fields."""
        t, m = self.transport, self.options.micro_batches
        t_start = self.clock()
        stop = self.stop_rule(k)
        acc = await accumulate(self.task, self.x, batches, m, step=k, device=self.device, stop=stop, clock=self.clock)
        drop(batches, m - acc.done)
        self.consumed += m
        t_comm = self.clock()
        summed = await ring_allreduce(t, _pack(acc), round=k, op="sum", tag=GRADIENT_TAG)
        total = round(float(summed[-1]))
        comm = self.clock() - t_comm
        grad = normalise(summed[:-1], total, workers=t.world_size, micro_batches=m, mode=self.options.normalisation)
        lr = self.config.lr(k)
        self.x = self.optimizer.update(self.x, grad, lr)
        self.completed.append(acc.done)
        self.completed_total.append(total)
        self.tau_in_force.append(self.tau_s if stop is not None else None)
        self.microbatch_s.append(round(statistics.fmean(acc.times_s), 6) if acc.times_s else None)
        if self.options.auto and self.chosen is None:
            self._samples.append([*acc.times_s, comm])
            if k + 1 == self.options.threshold_step:
                t_choose = self.clock()
                await self.choose_threshold(k)
                comm += self.clock() - t_choose
        step_s = self.clock() - t_start
        self.step_times.append(step_s)
        loss = acc.mean_loss if acc.mean_loss is not None else float("nan")
        return driver.step_done(k, lr=lr, loss=loss, compute_s=acc.compute_s, sleep_s=acc.sleep_s, comm_s=comm,
                                step_s=step_s)

    async def choose_threshold(self, k: int) -> ThresholdEstimate:
        """Gather every rank's micro-batch and all-reduce times of the steps so far; pick tau (all alike)."""
        t, m = self.transport, self.options.micro_batches
        rows = self._samples[1:] if len(self._samples) > 1 else self._samples  # step 0 carries the warm-up
        mine = torch.tensor(rows, dtype=torch.float64)  # (steps, M + 1)
        table = torch.zeros((t.world_size, *mine.shape), dtype=torch.float64)
        table[t.rank] = mine
        gathered = (await ring_allreduce(t, table, round=k, op="sum", tag=TIMING_TAG)).numpy()
        times = np.transpose(gathered[:, :, :m], (1, 0, 2))  # (steps, workers, M)
        # The all-reduce time of the slowest worker of a step is the pure communication (the others
        # also waited for it there): the least over workers, its median over steps.
        comm_s = float(np.median(np.min(gathered[:, :, m], axis=0)))
        self.chosen = best_threshold(times, comm_s=comm_s, count=self.options.candidates)
        self.microbatch_median_s = round(float(np.median(times)), 6)
        self.chosen_at, self.tau_s = k + 1, self.chosen.tau_s
        self._samples.clear()
        logger.info("rank %d: compute threshold %.4f s after step %d (predicted: steps %.2fx, drop %.1f %%, "
                    "effective %.2fx; communication %.4f s)", t.rank, self.chosen.tau_s, k + 1,
                    self.chosen.step_ratio, 100 * self.chosen.drop_rate, self.chosen.effective_ratio, comm_s)
        return self.chosen


def _pack(acc: Accumulated) -> torch.Tensor:
    """The step's one all-reduce vector: the summed gradient, then the completed count."""
    return torch.cat([acc.grad.reshape(-1), acc.grad.new_tensor([float(acc.done)])])


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else round(num / den, 6)
