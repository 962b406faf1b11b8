"""The AL-DSGD algorithm for the lock-step loop, and the task wrapper that feeds it the worker's loss.

:class:`ALDSGD` is a :class:`~squall.training.algorithms.base.Algorithm`: at iteration ``k`` it
takes the graph of ``k`` from its :class:`~squall.protocols.al_dsgd.schedule.GraphSchedule`, exchanges
its locally stepped parameters and a header (loss average, degree, period) with the graph's neighbours
(:mod:`~squall.protocols.al_dsgd.exchange`), and applies :mod:`~squall.protocols.al_dsgd.rule`. The
``Algorithm`` interface passes a gradient but not the loss, so the worker's loss reaches the
algorithm through :class:`LossTap`, a task wrapper whose ``loss_and_grad`` reports every loss
to :meth:`ALDSGD.observe_loss` before the loop calls ``step`` (the AL-DSGD job wraps the task so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from squall.protocols.al_dsgd.exchange import exchange, make_header
from squall.protocols.al_dsgd.rule import Peer, RuleConfig, combine, metropolis_row, plan
from squall.protocols.al_dsgd.schedule import GraphSchedule
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.training.tasks.base import Batch, Task
from squall.transport import Transport

NAME = "al_dsgd"


class ALDSGD(Algorithm):
    """AL-DSGD over ``transport`` (see the module docstring)."""

    name = NAME

    def __init__(self, transport: Transport, schedule: GraphSchedule, rule: RuleConfig | None = None, *,
                 optimizer: Sgd | None = None, timeout: float | None = None) -> None:
        super().__init__(optimizer=optimizer)
        if schedule.n != transport.world_size:
            raise ValueError(f"al_dsgd: the graph schedule has {schedule.n} nodes, the transport "
                             f"{transport.world_size} ranks")
        self.transport, self.schedule, self.rule = transport, schedule, rule or RuleConfig()
        self.timeout = timeout
        self.loss_avg: float | None = None
        self._stats: dict[str, float] = {}
        self._view: tuple[int, _Neighbourhood] | None = None  # (period, its neighbourhood): computed once a period

    def observe_loss(self, loss: float) -> None:
        """Fold this rank's latest training loss into its moving average (its performance)."""
        if not (math.isfinite(loss) and loss >= 0.0):
            raise ValueError(f"al_dsgd needs finite training losses >= 0 to rank workers, got {loss!r}")
        beta = self.rule.loss_ema
        self.loss_avg = loss if self.loss_avg is None else beta * self.loss_avg + (1.0 - beta) * loss

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self.loss_avg is None:
            raise RuntimeError("al_dsgd: no training loss observed before step; wrap the task in LossTap "
                               "(the al_dsgd job does) or call observe_loss")
        rank = self.transport.rank
        period = self.schedule.period(k)
        view = self._neighbourhood(period)
        half = self.optimizer.update(params, grad, lr).detach().reshape(-1)  # adapt, then combine
        header = make_header(self.loss_avg, view.degree, period)
        models, losses = await exchange(self.transport, half, header, view.neighbours, view.degrees,
                                        round=k, period=period, timeout=self.timeout)
        own = Peer(rank, self.loss_avg, view.degree)
        peers = [Peer(j, losses[j], view.degrees[j]) for j in view.neighbours]
        p = plan(own, peers, view.metropolis, self.rule)
        out = combine(rank, {**models, rank: half}, p, self.rule)
        self._stats = {
            "graph_period": float(period),
            "self_weight": p.weights[rank],
            "loss_avg": self.loss_avg,
            "pulled_best": 0.0 if p.best is None else 1.0,
            "pulled_degree": 0.0 if p.max_degree is None else 1.0,
        }
        return out.view(params.shape)

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def _neighbourhood(self, period: int) -> _Neighbourhood:
        if self._view is None or self._view[0] != period:
            graph, rank = self.schedule.graph_of_period(period), self.transport.rank
            degree = graph.degrees()
            neighbours = graph.neighbours(rank)
            self._view = (period, _Neighbourhood(neighbours, {j: int(degree[j]) for j in neighbours},
                                                 int(degree[rank]), metropolis_row(graph, rank)))
        return self._view[1]


@dataclass(frozen=True)
class _Neighbourhood:
    """This rank's view of one period's graph."""

    neighbours: tuple[int, ...]
    degrees: dict[int, int]  # every neighbour's degree
    degree: int  # this rank's degree
    metropolis: dict[int, float]  # D-PSGD's row on the closed neighbourhood


class LossTap(Task):
    """``task`` unchanged, except that every ``loss_and_grad`` also hands its loss to ``sink``."""

    def __init__(self, task: Task, sink: Callable[[float], None]) -> None:
        self.inner, self.sink = task, sink
        self.name = task.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def init_params(self, seed: int) -> torch.Tensor:
        return self.inner.init_params(seed)

    def loss_and_grad(self, params: torch.Tensor, batch: Batch) -> tuple[float, torch.Tensor]:
        loss, grad = self.inner.loss_and_grad(params, batch)
        self.sink(float(loss))
        return loss, grad

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        return self.inner.evaluate(params)

    def batches(self, rank: int, world: int, seed: int, batch_size: int) -> Iterator[Batch]:
        return self.inner.batches(rank, world, seed, batch_size)

    def __getattr__(self, item: str) -> Any:  # the wrapped task's other attributes (e.g. model_dim)
        if item == "inner":  # not yet set (during unpickling/copy): no recursion
            raise AttributeError(item)
        return getattr(self.inner, item)


@dataclass(frozen=True)
class AlDsgdOptions(RuleConfig):
    """AL-DSGD's options (``algorithm_args``): the graphs, and the rule's coefficients (:class:`RuleConfig`)."""

    topology: str | None = None  # one graph for every period (``topologies`` for several; ring by default)
    topologies: tuple[str, ...] | None = None  # graph names cycled through, one per period
    switch_every: int = 10  # iterations per graph
    graph_seed: int = 0  # seed of the graphs' relabelling
    relabel: bool = True  # draw new node labels at each switch
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.topology is not None and self.topologies is not None:
            raise ValueError("al_dsgd: give topology or topologies, not both")

    def graph_names(self) -> tuple[str, ...]:
        """The graphs cycled through."""
        return self.topologies if self.topologies is not None else (self.topology or "ring",)

    def rule(self) -> RuleConfig:
        """The combination rule's coefficients."""
        return RuleConfig(lambda_best=self.lambda_best, lambda_degree=self.lambda_degree, adapt=self.adapt,
                          loss_ema=self.loss_ema)


def build(transport: Transport, sgd: Sgd, options: AlDsgdOptions) -> ALDSGD:
    """AL-DSGD over ``transport`` (options: :class:`AlDsgdOptions`)."""
    schedule = GraphSchedule(transport.world_size, options.graph_names(), options.switch_every, options.graph_seed,
                             options.relabel)
    return ALDSGD(transport, schedule, options.rule(), optimizer=sgd, timeout=options.timeout)
