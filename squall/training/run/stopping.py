"""The stop rules every training protocol shares: step budget, time budget, target.

A rule set is declared in one of two kinds, by how ranks come to stop:

* **lock-step** (:meth:`StopRules.lockstep`; the all-reduce family, gossip, PS, MATCHA, gloo):
  every rank runs step ``k`` together, and all must leave after the same step. The ``steps``
  budget needs no communication and is checked after every step. The ``seconds`` budget (counted
  from the start barrier) and the ``target`` depend on the clock and on each rank's own
  evaluation, so they are checked only every ``check_every`` steps (default ``eval_every``), and
  after the first step, and decided by a :class:`~squall.training.vote.Vote` that gives every
  rank the same answer: any rank out of time stops everyone ("seconds"); the target stops
  everyone only when every rank has met it ("target"). A rank that expects its time budget to
  run out before the next regular vote (its mean step time so far, times the steps to that vote)
  says so, and from then on every rank votes after every step: a time budget ends the run
  within a step of it rather than a vote interval. With :func:`~squall.training.vote.local_vote`
  each rank decides alone, which is safe only when ranks cannot disagree (one rank, or a target on
  bit-identical parameters).
* **each alone** (:meth:`StopRules.each_alone`; SwarmSGD, Moshpit SGD): ranks have no common step
  and nothing needs every rank alive, so each decides after every one of its own steps, without
  a vote: ``steps`` when its budget is spent, ``seconds`` when its time is, ``target`` once every
  peer it knows of has met the target (the protocol says how it knows: ``everyone_reached``).

Both check in the same order: ``steps``, then ``seconds``, then ``target``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from squall.training.run.settings import LoopConfig
from squall.training.vote import Vote


@dataclass(frozen=True)
class StopRules:
    """When a rank stops training (see the module docstring); build with :meth:`lockstep` or :meth:`each_alone`."""

    config: LoopConfig  # budgets, target, check_every
    vote: Vote | None = None  # lock-step: the agreement (None: each alone)
    everyone_reached: Callable[[], bool] | None = None  # each alone: every known peer met the target

    def __post_init__(self) -> None:
        if (self.vote is None) == (self.everyone_reached is None):
            raise ValueError("stop rules are either lock-step (a vote) or each alone (everyone_reached), not both")

    @classmethod
    def lockstep(cls, config: LoopConfig, vote: Vote) -> StopRules:
        """Ranks in lock-step that agree by ``vote`` every ``check_every`` steps."""
        return cls(config, vote=vote)

    @classmethod
    def each_alone(cls, config: LoopConfig, everyone_reached: Callable[[], bool]) -> StopRules:
        """Ranks at their own pace, each deciding after every step without a vote."""
        return cls(config, everyone_reached=everyone_reached)

    @property
    def check_every(self) -> int:
        """Steps between lock-step votes."""
        return self.config.check_every or self.config.eval_every

    def at_start(self, elapsed_s: float) -> str | None:
        """Why not to train at all (a zero budget); each-alone ranks also check time and target."""
        if self.config.steps == 0:
            return "steps"
        return None if self.vote is not None else self.alone(0, elapsed_s)

    def steps_spent(self, done: int) -> bool:
        """True when ``done`` steps use up the step budget."""
        return self.config.steps is not None and done >= self.config.steps

    def vote_due(self, done: int, *, dense: bool = False) -> bool:
        """True when lock-step ranks vote after ``done`` steps (not when the step budget decides): every
        ``check_every`` steps, after the first step when there is a time budget (to learn the pace), and after
        every step once a vote said the budget runs out soon (``dense``)."""
        if self.vote is None or not self.config.needs_vote:
            return False
        timed = self.config.seconds is not None
        return done % self.check_every == 0 or (timed and (dense or done == 1))

    def soon(self, done: int, elapsed_s: float) -> bool:
        """Whether, at this rank's mean pace so far, the time budget runs out before the next regular vote."""
        if self.config.seconds is None or done <= 0:
            return False
        to_next = self.check_every - done % self.check_every
        return elapsed_s + to_next * elapsed_s / done >= self.config.seconds

    def out_of_time(self, elapsed_s: float) -> bool:
        """True when ``elapsed_s`` spends the time budget."""
        return self.config.seconds is not None and elapsed_s >= self.config.seconds

    def alone(self, done: int, elapsed_s: float) -> str | None:
        """Each-alone decision after ``done`` steps (None: go on)."""
        if self.everyone_reached is None:
            raise RuntimeError("lock-step stop rules decide by vote, not alone")
        if self.steps_spent(done):
            return "steps"
        if self.out_of_time(elapsed_s):
            return "seconds"
        if self.config.target is not None and self.everyone_reached():
            return "target"
        return None

    async def voted(self, done: int, elapsed_s: float, *, reached: bool) -> tuple[str | None, bool]:
        """Lock-step decision at a vote step (``reached``: this rank's evaluations met the target): why to stop
        (None: go on), and whether every rank votes after every step from now on."""
        if self.vote is None:
            raise RuntimeError("each-alone stop rules have no vote")
        out_of_time = self.out_of_time(elapsed_s)
        decision = await self.vote(done, out_of_time, reached=reached, soon=self.soon(done, elapsed_s))
        if not decision.stop:
            return None, decision.soon
        return ("seconds" if out_of_time or not reached else "target"), decision.soon
