"""``squall compare``: a baseline against a candidate, run as a fair experiment on every profile.

For each profile the two sides run on the same containers (one :class:`~squall.experiment.session.Session`,
so one cluster for the whole comparison, reshaped between profiles), in pairs that share a seed:
pair 0 runs baseline then candidate, pair 1 candidate then baseline, and so on (ABBA), so that a slow
drift of the host, or whatever the first run of a pair pays for the second, falls on both sides alike.
Every run is measured (:mod:`squall.checks.measures`); a run that failed or never reached the
target is kept, censored or failed, never dropped. Each measure's two samples go to
:func:`squall.compare.stats.compare_samples`, which gives the ratio candidate/baseline, its confidence
interval and a verdict: better, worse, same or unknown.

Pairs are added past ``runs`` until every gating measure is decided or the cap (``max_runs``, by
default twice ``runs``) is reached (:func:`squall.compare.stats.decided` says when). A clear difference
stops at ``runs``; a small one or a noisy network gets more pairs. tests/unit/test_compare_stats.py
simulates this design from the measured noise: it keeps the false-alarm rate of the fixed design and
finds a 20 % slow-down where ``runs`` fixed pairs would miss it too often.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from squall.checks.measures import TIME_TO_TARGET, Observation, higher_is_better, measure, measure_names
from squall.compare.stats import Comparison, Sample, compare_samples, decided
from squall.experiment.driver import ExperimentError
from squall.experiment.lab import RunSpec
from squall.experiment.matrix import MatrixFile
from squall.experiment.session import Session
from squall.programs.spec import ProgramSpec
from squall.programs.verdict import judge
from squall.run_trace import RunTrace
from squall.target import Target

logger = logging.getLogger(__name__)

SIDES = ("baseline", "candidate")
CONFIDENCE = 0.95
DEFAULT_RUNS = 5  # pairs per profile before early stopping may end the comparison
DEFAULT_TOLERANCE = 0.01  # criterion.rs's noise threshold too: below it a "detected" change is not worth a word
#: The overall word, most telling first: one worse measure makes the comparison a regression.
ORDER = ("worse", "better", "unknown", "same")


@dataclass(frozen=True)
class Side:
    """What one side runs: a user's program or a protocol (a RunSpec whose profile and seed are set per run)."""

    name: str  # "baseline" or "candidate"
    label: str  # what a person reads: the command line, the ref, the protocol and its options
    program: ProgramSpec | None = None
    protocol: RunSpec | None = None

    def __post_init__(self) -> None:
        if (self.program is None) == (self.protocol is None):
            raise ValueError(f"{self.name}: a side runs a program or a protocol, exactly one")


@dataclass(frozen=True)
class ComparePlan:
    """The whole experiment, validated before any container starts."""

    baseline: Side
    candidate: Side
    profiles: tuple[str, ...]  # each compared on its own
    workers: int  # cluster size
    runs: int = DEFAULT_RUNS  # pairs per profile (each side runs at least this many times)
    max_runs: int | None = None  # add pairs up to this many until decided (None: twice runs; = runs: fixed)
    seconds: float = 60.0  # each run's budget
    seed: int = 0  # pair k runs with seed + k on both sides
    target: Target | None = None  # time and bytes to it are measured when given
    figures: tuple[str, ...] = ()  # figures whose final value is compared (default: those the runs report)
    tolerance: float = 0.0  # a change smaller than this fraction is never a regression
    gate: tuple[str, ...] = ()  # measures that decide the exit code (empty: time to target if any, else all)
    confidence: float = CONFIDENCE  # of the whole verdict: gating measures share its error (Bonferroni)

    def __post_init__(self) -> None:
        if self.runs < 2:
            raise ValueError(f"--runs must be at least 2 (a comparison needs repeated runs), got {self.runs}")
        if self.max_runs is not None and self.max_runs < self.runs:
            raise ValueError(f"--max-runs ({self.max_runs}) must be at least --runs ({self.runs})")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"--tolerance must be a fraction in [0, 1), got {self.tolerance}")
        if not self.profiles:
            raise ValueError("give at least one --profile")

    @property
    def cap(self) -> int:
        """The most pairs a profile runs: ``max_runs``, by default twice ``runs``."""
        return self.max_runs if self.max_runs is not None else 2 * self.runs

    def side(self, name: str) -> Side:
        return self.baseline if name == "baseline" else self.candidate

    def gating(self, names: Sequence[str]) -> list[str]:
        """The measures among ``names`` that decide the exit code: ``gate``, else the time to the target when
        there is one (the question a comparison asks first), else every measure."""
        if self.gate:
            return [n for n in names if n in self.gate]
        if self.target is not None and TIME_TO_TARGET in names:
            return [TIME_TO_TARGET]
        return list(names)

    def each(self, gates: int) -> float:
        """The confidence of each of ``gates`` gating intervals so that all hold together at :attr:`confidence`
        (Bonferroni: a false regression on any of them at most ``1 - confidence``, half of it on the side
        of worse)."""
        return 1.0 - (1.0 - self.confidence) / max(1, gates)


@dataclass(frozen=True)
class RunOutcome:
    """One run of one side."""

    side: str  # baseline or candidate
    pair: int  # its pair's index
    seed: int
    trace: RunTrace | None  # None when it could not run
    passed: bool | None  # the run's own verdict (a program's), None when it has none or is unknown
    why: str  # the verdict's line, or why the run could not run
    measures: Mapping[str, Observation]
    seconds: float  # how long the run took, start-up included


@dataclass(frozen=True)
class MeasureResult:
    """One measure on one profile: both samples and the statistics."""

    name: str
    higher_is_better: bool
    baseline: Sample
    candidate: Sample
    comparison: Comparison
    gating: bool = False  # whether it decides the exit code

    def to_json(self) -> dict[str, Any]:
        c = self.comparison
        return {"baseline": list(self.baseline.values), "candidate": list(self.candidate.values),
                "baseline_censored": list(self.baseline.censored), "candidate_censored": list(self.candidate.censored),
                "higher_is_better": self.higher_is_better, "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
                "confidence": c.confidence, "verdict": c.verdict, "why": c.why, "gating": self.gating}


@dataclass(frozen=True)
class ProfileResult:
    """Every measure of one profile, and the runs behind them."""

    profile: str
    measures: tuple[MeasureResult, ...]
    runs: tuple[RunOutcome, ...]
    stopped_early: bool = False  # decided before max_runs

    def measure(self, name: str) -> MeasureResult:
        return next(m for m in self.measures if m.name == name)


@dataclass(frozen=True)
class CompareResult:
    """The comparison: per profile, per measure; the overall word and whether it is a regression."""

    plan: ComparePlan
    profiles: tuple[ProfileResult, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)  # backend, duration, provenance...

    def gating(self) -> list[MeasureResult]:
        """The measures that decide the exit code."""
        return [m for p in self.profiles for m in p.measures if m.gating]

    @property
    def regression(self) -> bool:
        """Whether a gating measure is worse."""
        return any(m.comparison.verdict == "worse" for m in self.gating())

    @property
    def verdict(self) -> str:
        """worse, better, unknown or same: the most telling word among the gating measures."""
        words = {m.comparison.verdict for m in self.gating()}
        return next((w for w in ORDER if w in words), "unknown")

    def to_json(self) -> dict[str, Any]:
        return {"regression": self.regression, "verdict": self.verdict,
                "baseline": self.plan.baseline.label, "candidate": self.plan.candidate.label,
                "runs": self.plan.runs, "tolerance": self.plan.tolerance,
                "gate": sorted({m.name for m in self.gating()}), "confidence": self.plan.confidence,
                "target": str(self.plan.target) if self.plan.target is not None else None,
                "profiles": [{"profile": p.profile, "stopped_early": p.stopped_early,
                              "pairs": len(p.runs) // 2,
                              "measures": {m.name: m.to_json() for m in p.measures},
                              "runs": [{"side": r.side, "pair": r.pair, "seed": r.seed, "passed": r.passed,
                                        "why": r.why, "seconds": round(r.seconds, 2)} for r in p.runs]}
                             for p in self.profiles],
                "meta": dict(self.meta)}


Progress = Callable[[str], None]


def _order(pair: int) -> tuple[str, str]:
    """ABBA: baseline first in even pairs, candidate first in odd ones."""
    return SIDES if pair % 2 == 0 else (SIDES[1], SIDES[0])


def run_one(session: Session, plan: ComparePlan, side: Side, profile: str, *, pair: int, logs: Path,
            label: str) -> RunOutcome:
    """One run of one side on ``profile``, measured."""
    seed = plan.seed + pair
    t = time.monotonic()
    trace: RunTrace | None = None
    passed: bool | None = None
    try:
        if side.program is not None:
            other = plan.candidate if side is plan.baseline else plan.baseline
            together = [other.program] if other.program is not None else []
            done = session.run_program(side.program, profile, plan.workers, seconds=plan.seconds, seed=seed,
                                       logs=logs / f"{side.name}-{pair}", label=label, together=together)
            trace = done.trace
            verdict = judge(trace, done.runs, target=plan.target, metric_names=side.program.metric_names)
            crashed = [r.describe() for r in done.runs if r.failed]
            passed = not crashed  # not reaching the target is measured (censored), not a failed run
            why = "; ".join(crashed) or verdict.line()
        else:
            assert side.protocol is not None
            spec = replace(side.protocol, profile=profile, seed=seed, seconds=plan.seconds, target=plan.target)
            trace = session.run(spec, plan.workers, label=label)
            why = f"{len(trace.records)} records, {len(trace.meta.failures)} failed runs of a node"
            passed = not trace.meta.failures
    except ExperimentError as exc:
        why = f"could not run: {exc}"
        logger.warning("%s: %s", label, why)
    figures = plan.figures or (tuple(_figures(trace)) if trace is not None else ())
    measures = measure(trace, target=plan.target, figures=figures, budget_s=plan.seconds, ok=passed is not False)
    return RunOutcome(side.name, pair, seed, trace, passed, why, measures, time.monotonic() - t)


def _figures(trace: RunTrace) -> list[str]:
    from squall.checks.measures import figures_of

    return figures_of(trace)


def _samples(runs: Sequence[RunOutcome], name: str, side: str) -> Sample:
    mine = sorted((r for r in runs if r.side == side), key=lambda r: r.pair)
    obs = [r.measures.get(name, Observation.failed()) for r in mine]
    return Sample(tuple(o.value for o in obs), tuple(o.censored for o in obs))


def judge_profile(plan: ComparePlan, profile: str, runs: Sequence[RunOutcome], *, gates: int,
                  stopped_early: bool = False) -> ProfileResult:
    """The statistics of every measure of one profile's runs: a gating measure at the confidence that keeps
    all ``gates`` of the comparison together at the plan's, the others (shown, not gating) at the plan's."""
    names = measure_names([r.measures for r in runs])
    gating = set(plan.gating(names))
    results = []
    for name in names:
        better_up = higher_is_better(name, plan.target)
        base, cand = _samples(runs, name, "baseline"), _samples(runs, name, "candidate")
        level = plan.each(gates) if name in gating else plan.confidence
        stats = compare_samples(base, cand, higher_is_better=better_up, tolerance=plan.tolerance, confidence=level)
        results.append(MeasureResult(name, better_up, base, cand, stats, name in gating))
    return ProfileResult(profile, tuple(results), tuple(runs), stopped_early)


def _all_decided(plan: ComparePlan, runs: Sequence[RunOutcome], done_pairs: int) -> bool:
    names = plan.gating(measure_names([r.measures for r in runs]))
    level = plan.each(len(names) * len(plan.profiles))
    return all(decided(_samples(runs, n, "baseline"), _samples(runs, n, "candidate"),
                       higher_is_better=higher_is_better(n, plan.target), tolerance=plan.tolerance,
                       confidence=level, looks_done=done_pairs, max_runs=plan.cap)
               for n in names)


def run_comparison(plan: ComparePlan, session: Session, *, logs: Path, progress: Progress = logger.info
                   ) -> tuple[ProfileResult, ...]:
    """Every profile's pairs of runs, judged (see the module docstring)."""
    ran: list[tuple[str, list[RunOutcome], bool]] = []
    for profile in plan.profiles:
        runs: list[RunOutcome] = []
        pair = 0
        cap = plan.cap
        stopped_early = False
        while pair < cap:
            for name in _order(pair):
                side = plan.side(name)
                label = f"{profile} pair {pair + 1}/{cap} {name}"
                outcome = run_one(session, plan, side, profile, pair=pair, logs=logs / _safe(profile), label=label)
                runs.append(outcome)
                progress(f"{label}: {_brief(outcome)}")
            pair += 1
            if pair >= plan.runs and pair < cap and _all_decided(plan, runs, pair):
                stopped_early = True
                break
        ran.append((profile, runs, stopped_early))
    gates = sum(len(plan.gating(measure_names([r.measures for r in runs]))) for _, runs, _ in ran)
    return tuple(judge_profile(plan, profile, runs, gates=gates, stopped_early=early) for profile, runs, early in ran)


def _safe(profile: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(profile).stem)


def _brief(outcome: RunOutcome) -> str:
    ttt = outcome.measures.get("time_to_target_s")
    reached = "" if ttt is None or ttt.value is None else (
        f"target not reached in {ttt.value:.1f} s, " if ttt.censored else f"target in {ttt.value:.2f} s, ")
    state = {True: "ok", False: "FAILED", None: "no verdict"}[outcome.passed]
    return f"{state}, {reached}{outcome.seconds:.1f} s in all"


# -- comparisons written as data: a matrix file's compare: entries, the plugin's marker ---------------------------
#: Keys of a comparison written as data.
COMPARE_KEYS = ("baseline", "candidate", "ref", "command", "runs", "max_runs", "tolerance", "gate", "seconds", "seed",
                "figures")


def protocol_words(text: str, *, where: str) -> tuple[str, dict[str, Any]]:
    """``NAME [KEY=VALUE ...]`` -> the protocol and its config (each value a YAML scalar)."""
    import shlex

    import yaml

    from squall.protocols.catalog import lookup

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {text!r}: {exc}") from None
    if not words:
        raise ValueError(f"{where}: give a protocol name, e.g. 'topk' or 'topk k=0.05'")
    try:
        lookup(words[0])
    except KeyError as exc:
        raise ValueError(f"{where}: {exc.args[0] if exc.args else exc}") from None
    config: dict[str, Any] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"{where}: {word!r}: expected KEY=VALUE (a key of the protocol's config)")
        config[key] = yaml.safe_load(value) if value else ""
    return words[0], config


def fraction(value: Any, *, where: str) -> float:
    """``2%``, ``"0.02"`` or ``0.02`` -> 0.02 (a tolerance)."""
    text = str(value).strip()
    try:
        out = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f"{where}: {value!r}: expected a percentage such as 2% or a fraction such as 0.02") from None
    if not 0 <= out < 1:
        raise ValueError(f"{where}: {value!r}: allowed: 0% up to (not including) 100%")
    return out


def side_from(name: str, value: Any, *, where: str, programs: Mapping[str, ProgramSpec],
              program: Callable[[list[str], str], ProgramSpec], run: Mapping[str, Any]) -> Side:
    """One side written as data: a command (a list of words), one of ``programs`` by name, or a protocol
    (``NAME [KEY=VALUE ...]``, run with the ``run`` fields: task, lr, config...)."""
    if isinstance(value, list | tuple):
        if not value or not all(isinstance(w, str) and w for w in value):
            raise ValueError(f"{where}: {name}: a command is a non-empty list of words, got {value!r:.120}")
        return Side(name, " ".join(value), program=program(list(value), name))
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {name}: expected a command (a list of words), a program's name or a protocol "
                         f"('NAME [KEY=VALUE ...]'), got {value!r:.120}")
    if value in programs:
        return Side(name, value, program=programs[value])
    protocol, config = protocol_words(value, where=f"{where}: {name}")
    fields = {k: v for k, v in run.items() if k in ("task", "lr", "batch_size", "steps")}
    merged = {**dict(run.get("config") or {}), **config}
    return Side(name, value, protocol=RunSpec(protocol=protocol, profile="lan", config=merged, **fields))


def plan_from(raw: Mapping[str, Any], *, where: str, profiles: Sequence[str], workers: int,
              program: Callable[[list[str], str], ProgramSpec], ref_snapshot: Callable[[str, list[str]], ProgramSpec],
              programs: Mapping[str, ProgramSpec] | None = None, run: Mapping[str, Any] | None = None,
              target: Target | None = None, seconds: float = 60.0) -> ComparePlan:
    """A comparison written as data (keys :data:`COMPARE_KEYS`): ``baseline`` and ``candidate`` (each a command,
    a program's name or a protocol), or ``ref`` and ``command`` (the folder at a git ref against the folder as
    it is now); ``runs``, ``max_runs``, ``tolerance``, ``gate``, ``seconds``, ``seed``, ``figures``.

    :param program: makes a program of a command and a side's name (the caller's metrics, target, folder...).
    :param ref_snapshot: makes the baseline program of ``ref`` and ``command`` (a copy of the folder at the ref).
    :raises ValueError: naming ``where`` and the key.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: a comparison is a mapping with keys {list(COMPARE_KEYS)}, got {raw!r:.120}")
    unknown = sorted(set(raw) - set(COMPARE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {list(COMPARE_KEYS)}")
    run = run or {}
    if "ref" in raw:
        if "baseline" in raw or "candidate" in raw:
            raise ValueError(f"{where}: give ref and command, or baseline and candidate, not both")
        command = raw.get("command")
        if not isinstance(command, list | tuple) or not command or not all(isinstance(w, str) for w in command):
            raise ValueError(f"{where}: ref: needs command, the command as a list of words")
        base_program = ref_snapshot(str(raw["ref"]), list(command))
        cand_program = program(list(command), "candidate")
        base = Side("baseline", f"{' '.join(command)} at {raw['ref']}", program=base_program)
        cand = Side("candidate", f"{' '.join(command)} as it is now", program=cand_program)
    else:
        missing = [k for k in ("baseline", "candidate") if k not in raw]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing} (or give ref and command)")
        made = [side_from(k, raw[k], where=where, programs=programs or {}, program=program, run=run)
                for k in ("baseline", "candidate")]
        base, cand = made
        if (base.program is None) != (cand.program is None):
            raise ValueError(f"{where}: baseline and candidate must both be programs or both be protocols")
    gate = raw.get("gate") or []
    gate = [gate] if isinstance(gate, str) else gate
    figures = raw.get("figures") or []
    runs = raw.get("runs", DEFAULT_RUNS)
    max_runs = raw.get("max_runs")
    for key, value in (("runs", runs), ("max_runs", max_runs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{where}: {key}: expected an integer, got {value!r}")
    try:
        return ComparePlan(baseline=base, candidate=cand, profiles=tuple(profiles), workers=workers, runs=runs,
                           max_runs=max_runs, seconds=float(raw.get("seconds", seconds)), seed=int(raw.get("seed", 0)),
                           target=target, figures=tuple(str(f) for f in figures),
                           tolerance=fraction(raw.get("tolerance", DEFAULT_TOLERANCE), where=f"{where}: tolerance"),
                           gate=tuple(str(g) for g in gate))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def matrix_plans(spec: MatrixFile, *, where: str, base: Path, staging: Path) -> list[ComparePlan]:
    """The ``compare:`` entries of a matrix file as plans: every profile of the matrix, one plan per cluster size;
    a side names one of the file's programs, a protocol with its options, or a command (run with the matrix's
    ``run:`` settings). Checked before anything starts.

    :param base: the matrix file's folder (a command's folder and a ref's repository are found from it).
    :param staging: where a ``ref``'s copy of the folder is made.
    """
    from squall.programs.snapshot import resolve_ref, snapshot_ref
    from squall.programs.spec import program_from_mapping

    run = dict(spec.run)
    target = Target.of(run.get("target"))
    programs = {p.name: p for p in spec.matrix.programs}
    seconds = float(run.get("seconds") or 60.0)
    plans = []
    for k, raw in enumerate(spec.compare):
        here = f"{where}: compare[{k}]"

        def program(command: list[str], name: str, workdir: str | None = None, here: str = here) -> ProgramSpec:
            entry = {"command": command, "name": name, **({"workdir": workdir} if workdir else {}),
                     "nproc_per_node": spec.nproc_per_node}
            if target is not None:
                entry["target"] = str(target)
            return program_from_mapping(entry, source=here, base=base)

        def ref_program(ref: str, command: list[str], here: str = here, k: int = k) -> ProgramSpec:
            folder = program(command, "candidate").workdir
            snap = snapshot_ref(resolve_ref(ref, folder, flag=f"{here}: ref"), staging / f"ref-{k}")
            return program(command, "baseline", workdir=snap.path)

        for workers in spec.matrix.workers:
            plans.append(plan_from(raw, where=here, profiles=spec.matrix.profiles, workers=workers, program=program,
                                   ref_snapshot=ref_program, programs=programs, run=run, target=target,
                                   seconds=seconds))
    return plans
