"""A claim as data, and what a claim kind is: the keys it reads and how it is measured.

Every claim in ``claims.yaml`` has the common keys (:data:`COMMON`); which of the standard
measurement keys (:data:`STANDARD`) it must or may carry, and which of its own keys it accepts under
``params``, is up to its kind (``check:``). A kind is one module of :mod:`squall.claims.kinds`
exporting ``KIND`` (or ``KINDS``); nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from squall.checks import Target, Verdict
from squall.experiment.lab import RunSpec
from squall.run_trace import RunTrace

#: Runs one spec on a cluster of ``workers`` and returns its trace (the plugin's ``squall_run``, or a Lab).
Runner = Callable[[RunSpec, int], RunTrace]

#: Keys every claim has (``gate`` defaults to true).
COMMON = frozenset({"id", "paper", "claim", "paper_figure", "our_setting", "check", "gate"})
#: Measurement keys a kind may require or accept; their meaning is the same in every kind.
STANDARD = frozenset({"fast", "slow", "protocols", "profiles", "workers", "seeds", "target", "at_least", "at_most",
                      "run", "params"})
#: RunSpec fields a claim's ``run`` may set.
RUN_FIELDS = frozenset({"seconds", "steps", "lr", "task", "batch_size", "config"})


class ClaimError(ValueError):
    """A claim in the registry is malformed; names the claim, the key and what is allowed."""


@dataclass(frozen=True)
class Claim:
    """One paper's claim and our scaled-down test of it (the standard keys a kind does not use stay empty)."""

    id: str  # registry id
    paper: str  # short citation
    claim: str  # the claim in words
    paper_figure: str  # the paper's number and setting
    our_setting: str  # our scaled-down setting, in words
    check: str  # the claim's kind, e.g. "speedup"
    fast: str = ""  # protocol expected to be faster / better
    slow: str = ""  # protocol it is compared with
    protocols: tuple[str, ...] = ()  # protocols a kind runs besides fast and slow
    profiles: tuple[str, ...] = ()  # profiles, in the order the kind reads them
    workers: int = 0  # cluster size
    seeds: tuple[int, ...] = ()  # seeds; figures are medians over them
    target: Target | None = None  # what "reached the target" means
    at_least: float | None = None  # lower threshold on the kind's figure
    at_most: float | None = None  # upper threshold on the kind's figure
    run: Mapping[str, Any] = field(default_factory=dict)  # RunSpec fields: seconds, lr, config...
    params: Mapping[str, Any] = field(default_factory=dict)  # the kind's own keys
    gate: bool = True  # whether CI fails when the claim does not hold (false: reported only)

    def spec(self, protocol: str, profile: str, seed: int, **config: Any) -> RunSpec:
        """The run of ``protocol`` for one seed on one profile (``config`` is merged into the run's config)."""
        run = dict(self.run)
        if "steps" in run:
            run.setdefault("seconds", None)  # a step budget alone: no time budget cuts it short
        if config:
            run["config"] = {**dict(run.get("config") or {}), **config}
        return RunSpec(protocol=protocol, profile=profile, seed=seed, target=self.target, **run)

    @property
    def names(self) -> tuple[str, ...]:
        """Every protocol the claim runs."""
        return tuple(dict.fromkeys(p for p in (self.fast, self.slow, *self.protocols) if p))


@dataclass(frozen=True)
class ClaimKind:
    """How one kind of claim is read and measured."""

    name: str  # the value of ``check:``
    requires: frozenset[str]  # standard keys the claim must have
    evaluate: Callable[[Claim, Runner], Verdict]  # measure it (a pure-maths kind ignores the runner)
    accepts: frozenset[str] = frozenset()  # standard keys it may have besides
    params: frozenset[str] = frozenset()  # keys allowed under ``params``
    required_params: frozenset[str] = frozenset()  # keys that must be under ``params``
    validate: Callable[[Claim], None] | None = None  # extra checks; raise ValueError naming the key

    def __post_init__(self) -> None:
        unknown = (self.requires | self.accepts) - STANDARD
        if unknown:
            raise ValueError(f"claim kind {self.name!r}: {sorted(unknown)} are not standard keys {sorted(STANDARD)}")


def interleaved(claim: Claim, profile: str, run: Runner, protocols: Sequence[str],
                **config: Any) -> dict[str, list[RunTrace]]:
    """Run ``protocols`` interleaved over the claim's seeds (a b a b ...) on ``profile``; traces by protocol.

    Interleaving makes slow drifts of a shared machine hit every side alike.
    """
    out: dict[str, list[RunTrace]] = {p: [] for p in protocols}
    for seed in claim.seeds:
        for name in protocols:
            out[name].append(run(claim.spec(name, profile, seed, **config), claim.workers))
    return out
