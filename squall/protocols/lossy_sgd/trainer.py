"""One worker of lossy_sgd: the iteration loop over a :class:`LossyLink` (no retransmission anywhere).

Iteration ``t`` on rank ``r`` (``x``: this worker's copy of all parameters)::

    g = gradient of x on the next local batch
    every drift_every iterations: send x[shard s] to owner s (PROBE packets), for every s != r
    resync:     send g[shard s] to owner s (GRADIENT packets), for every s != r
    no resync:  send g[shard s] to every peer, for every s
    wait for GRADIENT packets of t until all arrived or deadline_s passed; later ones are late
    drift: for every probe that arrived, ||probe - x[shard r]||^2 (both are the values after t - 1)
    resync:     x[shard r] <- sgd(x[shard r], reconstruct(own, arrived))      the owner's step
                send x[shard r] to every peer (BROADCAST packets)
                wait for BROADCAST packets of t (deadline_s); copy each arrived packet into x;
                a missed packet leaves its coordinates stale
    no resync:  x <- sgd(x, reconstruct every shard's packets from what arrived)

The owner's shard is the reference: the mean drift ``(1/N) sum_i ||x_i - x_owner||^2`` is the sum
over owners of each owner's ``drift`` record field (its shard's share, measured from the probes
that arrived, scaled up for the probe packets that were lost), recorded for the iteration it was
measured at (``drift_at``). Likewise ``grad_sq``, the squared norm of the owner's reconstructed
shard gradient, sums over owners to ``||g||^2`` of the step (the G^2 of the analytic drift bound
``c lr^2 G^2 p / (1 - p)``). Stop rules: step and time budgets, each worker alone (no vote: a vote
over lossy datagrams could split the workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from squall.protocols.lossy_sgd.estimator import reconstruct
from squall.protocols.lossy_sgd.inbox import DROP_REASONS, Slot
from squall.protocols.lossy_sgd.link import LossyLink
from squall.protocols.lossy_sgd.options import LossyOptions
from squall.protocols.lossy_sgd.packets import Phase, encode_packets
from squall.training.optim import Sgd
from squall.training.run import Driver, LoopConfig, MetricsSink, StopRules, TrainResult
from squall.training.tasks.base import Batch, Task

logger = logging.getLogger(__name__)


class LossyTrainer:
    """One rank's training (see the module docstring)."""

    def __init__(self, task: Task, link: LossyLink, config: LoopConfig, options: LossyOptions, *,
                 optimizer: Sgd | None = None, write: MetricsSink | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.task, self.link, self.config, self.options = task, link, config, options
        self.optimizer = optimizer or Sgd()
        self.write, self.clock = write, clock
        self.layout, self.inbox = link.layout, link.inbox
        self.rank, self.workers = link.rank, link.world_size
        self.x = task.init_params(config.seed).to(torch.float32)
        if self.x.numel() != self.layout.dim:
            raise ValueError(f"layout is for {self.layout.dim} parameters, the task has {self.x.numel()}")
        self.expected = {phase: 0 for phase in (Phase.GRADIENT, Phase.BROADCAST)}
        self.arrived = {phase: 0 for phase in (Phase.GRADIENT, Phase.BROADCAST)}
        self.last: dict[str, Any] = {}  # this iteration's protocol fields
        self.drift_history: list[tuple[int, float]] = []  # (iteration, this owner's shard share)

    # -- record fields ----------------------------------------------------------------------------
    def missed_fraction(self, phase: Phase | None = None) -> float | None:
        """Fraction of the expected packets (of ``phase``, or all) that had not arrived by their deadline."""
        phases = [phase] if phase is not None else list(self.expected)
        expected = sum(self.expected[p] for p in phases)
        return None if expected == 0 else 1 - sum(self.arrived[p] for p in phases) / expected

    def loss_estimate(self) -> float:
        """p for inverse-probability weighting: the option, else the gradient packets missed so far."""
        if self.options.assumed_loss is not None:
            return self.options.assumed_loss
        missed = self.missed_fraction(Phase.GRADIENT)
        return min(missed if missed is not None else 0.0, 0.99)

    def stats(self) -> dict[str, Any]:
        """Per-step fields: drift (when measured), stale coordinates, packets missed, drops by reason."""
        out: dict[str, Any] = {
            "drift": None, "drift_at": None, "drift_workers": None, "stale_coords": None,
            "grad_arrived": None, "bcast_arrived": None, "grad_sq": None, **self.last,
            "missed_fraction": _round(self.missed_fraction()),
        }
        out.update({f"dropped_{reason}": self.inbox.dropped[reason] for reason in DROP_REASONS})
        return out

    def summary(self) -> dict[str, Any]:
        """End-record fields: per-link datagram counts (for the measured loss), drops, the layout."""
        opts, layout = self.options, self.layout
        peers = range(self.workers)
        return {
            "resync": opts.resync,
            "estimator": opts.estimator,
            "deadline_s": opts.deadline_s,
            "packet_floats": layout.capacity,
            "packets_per_iteration": layout.total_packets(),
            "sent_to": [self.link.counters[p].messages_sent if p != self.rank else 0 for p in peers],
            "received_from": [self.link.counters[p].messages_received if p != self.rank else 0 for p in peers],
            "missed_fraction": _round(self.missed_fraction()),
            "grad_missed_fraction": _round(self.missed_fraction(Phase.GRADIENT)),
            "bcast_missed_fraction": _round(self.missed_fraction(Phase.BROADCAST)),
            "stored_packets": self.inbox.stored,
            "drift_history": [[t, round(d, 9)] for t, d in self.drift_history],
            **{f"dropped_{reason}": self.inbox.dropped[reason] for reason in DROP_REASONS},
        }

    # -- training ---------------------------------------------------------------------------------
    async def run(self) -> TrainResult:
        """Wait for every peer, train until a budget stops this rank; returns its result."""
        cfg = self.config
        driver = Driver(self.task, StopRules.each_alone(cfg, lambda: False), rank=self.rank, model=lambda: self.x,
                        write=self.write, traffic=self.link.total, stats=self.stats, clock=self.clock)
        batches = self.task.batches(self.rank, self.workers, cfg.seed, cfg.batch_size)
        await self.link.ready(self.options.ready_timeout_s)
        done = 0
        stopped_by = await driver.begin()
        while stopped_by is None:
            fields = await self.step(done, batches, driver)
            done += 1
            stopped_by = await driver.after_step(done, fields)
        return await driver.finish(done, stopped_by, stats=self.summary())

    async def step(self, t: int, batches: Iterator[Batch], driver: Driver) -> dict[str, Any]:
        """Iteration ``t`` (see the module docstring); returns its record fields."""
        opts, layout, link, r = self.options, self.layout, self.link, self.rank
        self.inbox.advance(t)
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.x, next(batches))
        grad = grad.to(torch.float32).reshape(-1)
        t_comm = self.clock()
        self.last = {}
        if t % opts.drift_every == 0:
            for s in link.peers:
                link.send(s, self._packets(self.x, Phase.PROBE, s, t))
        for peer in link.peers:
            shards = [peer] if opts.resync else range(self.workers)
            link.send(peer, [d for s in shards for d in self._packets(grad, Phase.GRADIENT, s, t)])
        slot = await self._wait(Phase.GRADIENT, t)
        self._count(Phase.GRADIENT, slot)
        self._measure_drift(t, self.inbox.take(Phase.PROBE, t))
        lr = self.config.lr(t)
        if opts.resync:
            start, stop = layout.shard_range(r)
            own = self._reconstruct(grad, slot, r)
            self.last["grad_sq"] = float(own.double() @ own.double())
            self.x[start:stop] = self.optimizer.update(self.x[start:stop], own, lr)
            for peer in link.peers:
                link.send(peer, self._packets(self.x, Phase.BROADCAST, r, t))
            self._apply_broadcasts(await self._wait(Phase.BROADCAST, t))
        else:
            full = torch.cat([self._reconstruct(grad, slot, s) for s in range(self.workers)])
            start, stop = layout.shard_range(r)
            self.last["grad_sq"] = float(full[start:stop].double() @ full[start:stop].double())
            self.x = self.optimizer.update(self.x, full, lr)
        now = self.clock()
        return driver.step_done(t, lr=lr, loss=loss, compute_s=t_comm - t_start, sleep_s=0.0, comm_s=now - t_comm,
                                step_s=now - t_start)

    async def _wait(self, phase: Phase, t: int) -> Slot:
        opts = self.options
        return await self.inbox.wait(phase, t, opts.deadline_s, opts.spread_s, opts.max_wait_s)

    def _packets(self, vector: torch.Tensor, phase: Phase, shard: int, t: int) -> list[bytes]:
        start, stop = self.layout.shard_range(shard)
        return encode_packets(self.layout, vector[start:stop], phase=phase, shard=shard, iteration=t,
                              sender=self.rank, limits=self.link.limits)

    def _count(self, phase: Phase, slot: Slot) -> None:
        self.expected[phase] += slot.expected
        self.arrived[phase] += slot.received
        key = "grad_arrived" if phase is Phase.GRADIENT else "bcast_arrived"
        self.last[key] = slot.received

    def _reconstruct(self, grad: torch.Tensor, slot: Slot, shard: int) -> torch.Tensor:
        """Shard ``shard``'s reconstructed mean gradient, packet by packet."""
        layout, opts = self.layout, self.options
        start, _ = layout.shard_range(shard)
        loss = self.loss_estimate() if opts.estimator == "inverse_probability" else 0.0
        pieces = []
        for packet in range(layout.packets(shard)):
            lo, hi = layout.packet_range(shard, packet)
            own = grad[start + lo:start + hi].double()
            summed = slot.sums.get((shard, packet))
            others = torch.zeros_like(own) if summed is None else torch.from_numpy(summed)
            pieces.append(reconstruct(own, others, slot.counts[(shard, packet)], self.workers,
                                      estimator=opts.estimator, loss=loss))
        return torch.cat(pieces).to(torch.float32)

    def _apply_broadcasts(self, slot: Slot) -> None:
        """Copy every broadcast packet that arrived into ``x``; the rest stay stale."""
        self._count(Phase.BROADCAST, slot)
        layout = self.layout
        fresh = 0
        for (shard, packet), values in slot.sums.items():
            start, _ = layout.shard_range(shard)
            lo, hi = layout.packet_range(shard, packet)
            self.x[start + lo:start + hi] = torch.from_numpy(values.astype(np.float32))
            fresh += hi - lo
        self.last["stale_coords"] = layout.dim - layout.shard_len(self.rank) - fresh

    def _measure_drift(self, t: int, probes: Slot) -> None:
        """This owner's share of the mean drift at the start of ``t``, from the probes that arrived."""
        if not probes.probes:
            return
        layout, r = self.layout, self.rank
        start, _ = layout.shard_range(r)
        mine = self.x.double().numpy()
        per_sender: dict[int, list[float]] = {}
        for p in probes.probes:
            lo, hi = layout.packet_range(r, p.packet)
            diff = p.values.astype(np.float64) - mine[start + lo:start + hi]
            per_sender.setdefault(p.sender, []).append(float(diff @ diff))
        packets = layout.packets(r)
        shares = [sum(d) * packets / len(d) for d in per_sender.values()]  # scaled up for lost probe packets
        drift = sum(shares) / len(shares) * (self.workers - 1) / self.workers  # the owner's own share is 0
        self.drift_history.append((t, drift))
        self.last.update({"drift": drift, "drift_at": t, "drift_workers": len(shares)})


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
