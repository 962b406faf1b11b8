"""A noise model of repeated runs, fitted to runs measured on this host, and comparisons simulated from it.

The tests and ``benchmarks/compare_power.py`` judge :func:`squall.compare.stats.compare_samples` with
thousands of comparisons drawn from this model: how often it says ``worse`` when the two sides are
the same, and how often it finds a true slow-down. The model is fitted to real runs
(``noise_model.json`` beside this module, measured by ``benchmarks/compare_noise.py``), not guessed.

**The model** of one run's time to target ``T``, for the pair ``k`` it belongs to::

    T = r * exp(mu + a_k + e) + S        a_k ~ N(0, drift^2), e ~ N(0, sigma^2)
    S = 0, or with probability tail_p a stall ~ Exponential(mean tail_mean * exp(mu))

* ``a_k`` is what the pair shares (the host's slow drift, the same seed); it cancels in the pair's
  log-ratio, and only ``sigma``, the noise within a pair, enters the comparison;
* ``S`` is the heavy tail: on a lossy link a lost packet early in a connection waits out a
  retransmission timeout, a stall of a fixed size that a run either has or has not;
* ``r`` is the true ratio candidate/baseline (1 for the baseline and in an A/A comparison); a stall is
  the network's and is not scaled;
* a run is censored (did not reach the target in its budget) with probability ``censor_p`` or when
  ``T`` exceeds the budget, and failed (no value) with probability ``fail_p``;
* ``order_shift``: the mean log-ratio second/first run of a pair measured here. ``squall compare``
  alternates which side runs first (ABBA), so the simulation adds it to the second run of each pair
  with that alternation.

**The fit** (:func:`fit_noise_model`) takes one profile's runs in the order they ran; consecutive
runs (1-2, 3-4, ...) are A/A pairs. A stall is a run slower than the median by more than
:data:`STALL_SIGMAS` robust standard deviations of the log-times (1.4826 times their median absolute
deviation, at least :data:`MIN_SCALE`); ``sigma`` comes from the pairs with no stall,
``sigma^2 = mean(d^2) / 2``, the rest of the log-time variance is ``drift``.
With a handful of runs each figure is rough; docs/compare-statistics.md gives them with that caveat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from squall.compare.stats import Sample

#: A run is a stall when its log-time exceeds the median by this many robust standard deviations.
STALL_SIGMAS = 4.0
#: The least robust standard deviation of log-times the stall rule uses (1 %): a host this quiet
#: would otherwise call a 2 % slower run a stall.
MIN_SCALE = 0.01


#: The kinds of measured sets: A/A pairs run by squall compare (the model's source), or separate runs.
KINDS = ("compare-pairs", "separate-runs")


class NoiseError(ValueError):
    """Measured runs a model cannot be fitted to; the message says which and why."""


@dataclass(frozen=True)
class Run:
    """One measured run of one profile."""

    seconds: float | None  # its time to target, or its budget when censored; None when it failed
    censored: bool = False  # it never reached the target within its budget (seconds is the budget)


@dataclass(frozen=True)
class NoiseModel:
    """The fitted noise of one profile's time to target (the module docstring gives the model)."""

    profile: str  # the profile the runs were measured on
    median_s: float  # exp(mu): the median time to target of the runs with no stall, seconds
    sigma: float  # standard deviation of one run's log-time within its pair
    drift: float  # standard deviation of a pair's shared log-level, between pairs
    tail_p: float  # probability that a run has a stall
    tail_mean: float  # a stall's mean length, as a fraction of median_s
    censor_p: float  # probability that a run is censored (never reached the target in its budget)
    fail_p: float  # probability that a run fails (no value)
    order_shift: float  # mean log-ratio second/first run of an A/A pair
    n_runs: int  # runs the model was fitted to
    n_pairs: int  # A/A pairs with no stall that gave sigma
    measured: str = ""  # the measured set (noise_model.json) it was fitted to; "" for a model made by hand

    def __post_init__(self) -> None:
        for name in ("median_s", "sigma", "drift", "tail_p", "tail_mean", "censor_p", "fail_p"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise NoiseError(f"noise model of {self.profile}: {name}={value!r}; allowed: a finite number >= 0")
        if self.median_s <= 0:
            raise NoiseError(f"noise model of {self.profile}: median_s must be positive")
        if self.tail_p + self.censor_p + self.fail_p > 1:
            raise NoiseError(f"noise model of {self.profile}: tail_p + censor_p + fail_p exceed 1")


def fit_noise_model(profile: str, runs: Sequence[Run], *, measured: str = "") -> NoiseModel:
    """The model of ``runs`` (one profile's, in the order they ran; consecutive runs are A/A pairs)."""
    if len(runs) < 4:
        raise NoiseError(f"{profile}: {len(runs)} runs; allowed: at least 4 (two A/A pairs)")
    for i, run in enumerate(runs):
        if run.seconds is not None and not (math.isfinite(run.seconds) and run.seconds > 0):
            raise NoiseError(f"{profile} run {i + 1}: {run.seconds!r} s; allowed: a positive number or None (failed)")
        if run.seconds is None and run.censored:
            raise NoiseError(f"{profile} run {i + 1}: censored with no budget; allowed: a censored run has seconds")
    reached = [(i, math.log(r.seconds)) for i, r in enumerate(runs) if r.seconds is not None and not r.censored]
    if len(reached) < 4:
        raise NoiseError(f"{profile}: {len(reached)} runs reached the target; allowed: at least 4 to fit a model")
    logs = np.array([x for _, x in reached])
    centre = float(np.median(logs))
    scale = max(1.4826 * float(np.median(np.abs(logs - centre))), MIN_SCALE)
    stall = {i for i, x in reached if x - centre > STALL_SIGMAS * scale}
    plain = {i: x for i, x in reached if i not in stall}
    diffs = np.array([plain[i + 1] - plain[i] for i in range(0, len(runs) - 1, 2) if i in plain and i + 1 in plain])
    plain_logs = np.array(list(plain.values()))
    # With fewer than two clean pairs, the whole spread is taken as within-pair noise (no drift).
    sigma = (math.sqrt(float(np.mean(diffs**2)) / 2.0) if len(diffs) >= 2
             else float(np.std(plain_logs, ddof=1)))
    drift = math.sqrt(max(0.0, float(np.var(plain_logs, ddof=1)) - sigma**2))
    median_s = math.exp(float(np.median(plain_logs)))
    excess = [math.exp(x) - median_s for i, x in reached if i in stall]
    return NoiseModel(
        profile=profile, measured=measured, median_s=median_s, sigma=sigma, drift=drift,
        tail_p=len(stall) / len(runs), tail_mean=(float(np.mean(excess)) / median_s) if excess else 0.0,
        censor_p=sum(r.censored for r in runs) / len(runs), fail_p=sum(r.seconds is None for r in runs) / len(runs),
        order_shift=float(np.mean(diffs)) if len(diffs) else 0.0, n_runs=len(runs), n_pairs=len(diffs),
    )


@dataclass(frozen=True)
class Simulated:
    """Comparisons drawn from a model: row i is comparison i, column k its pair k."""

    baseline: np.ndarray  # (comparisons, pairs) seconds; NaN where the run failed
    baseline_censored: np.ndarray  # (comparisons, pairs) bool: the value is the budget, a lower bound
    candidate: np.ndarray  # as baseline, for the candidate
    candidate_censored: np.ndarray  # as baseline_censored

    def samples(self, i: int, pairs: int | None = None) -> tuple[Sample, Sample]:
        """Comparison ``i``'s first ``pairs`` pairs (all by default) as the two sides' samples."""
        k = self.baseline.shape[1] if pairs is None else pairs
        return (_sample(self.baseline[i, :k], self.baseline_censored[i, :k]),
                _sample(self.candidate[i, :k], self.candidate_censored[i, :k]))


def _sample(values: np.ndarray, censored: np.ndarray) -> Sample:
    return Sample(tuple(None if math.isnan(v) else float(v) for v in values), tuple(bool(c) for c in censored))


def simulate(model: NoiseModel, rng: np.random.Generator, *, comparisons: int, pairs: int, ratio: float = 1.0,
             budget_s: float | None = None) -> Simulated:
    """``comparisons`` comparisons of ``pairs`` pairs each, the candidate ``ratio`` times the baseline.

    ``budget_s``: each run's budget; a run slower than it is censored at it (default: 10 times the
    median, beyond any stall measured here). Every draw is vectorised: thousands of comparisons take
    milliseconds.
    """
    if comparisons < 1 or pairs < 1:
        raise NoiseError(f"comparisons={comparisons}, pairs={pairs}; allowed: at least 1 each")
    if not (math.isfinite(ratio) and ratio > 0):
        raise NoiseError(f"ratio={ratio!r}; allowed: a positive number")
    budget = 10.0 * model.median_s if budget_s is None else budget_s
    shape = (comparisons, pairs)
    level = math.log(model.median_s) + model.drift * rng.standard_normal(shape)
    # ABBA: the second run of pair k is the candidate's in even pairs, the baseline's in odd ones.
    second_is_candidate = (np.arange(pairs) % 2 == 0)[None, :]
    shift_c = np.where(second_is_candidate, model.order_shift, 0.0)
    shift_b = np.where(second_is_candidate, 0.0, model.order_shift)

    def side(scale: float, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = scale * np.exp(level + shift + model.sigma * rng.standard_normal(shape))
        stalls = rng.random(shape) < model.tail_p
        t = t + np.where(stalls, rng.exponential(model.tail_mean * model.median_s, shape), 0.0)
        fate = rng.random(shape)
        failed = fate < model.fail_p
        censored = ~failed & ((fate < model.fail_p + model.censor_p) | (t > budget))
        t = np.where(censored, budget, t)
        return np.where(failed, np.nan, t), censored

    b, b_cens = side(1.0, shift_b)
    c, c_cens = side(ratio, shift_c)
    return Simulated(b, b_cens, c, c_cens)


def runs_of(data: Mapping[str, Any], where: str = "noise data") -> dict[str, dict[str, list[Run]]]:
    """The measured runs in ``data`` (``noise_model.json``'s object): set by set, profile by profile, in
    the order they ran.

    ``data["sets"]`` is a list of sets, each with a ``name``, a ``kind`` (``compare-pairs``: A/A pairs
    run by squall compare; ``separate-runs``: runs each on a fresh cluster) and ``profiles``: for each
    profile a ``runs`` list of rows with ``outcome`` (``reached``, ``censored`` or ``failed``) and
    ``time_to_target_s`` (for a censored run, its budget in ``budget_s``).
    """
    sets = data.get("sets")
    if not isinstance(sets, list) or not sets:
        raise NoiseError(f"{where}: no 'sets' list; allowed: [{{name, kind, profiles: {{profile: {{runs}}}}}}]")
    out: dict[str, dict[str, list[Run]]] = {}
    for n, entry in enumerate(sets):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name or name in out:
            raise NoiseError(f"{where}: set {n + 1} has name {name!r}; allowed: a name no other set has")
        if entry.get("kind") not in KINDS:
            raise NoiseError(f"{where}: set {name} has kind {entry.get('kind')!r}; allowed: {', '.join(KINDS)}")
        profiles = entry.get("profiles")
        if not isinstance(profiles, Mapping) or not profiles:
            raise NoiseError(f"{where}: set {name} has no 'profiles' object")
        out[name] = {str(profile): _runs(rows.get("runs") if isinstance(rows, Mapping) else None,
                                         f"{where}: {name} {profile}")
                     for profile, rows in profiles.items()}
    return out


def models_of(data: Mapping[str, Any], where: str = "noise data") -> list[NoiseModel]:
    """A model for every profile of every ``compare-pairs`` set: the noise squall compare's own pairs had."""
    kinds = {s["name"]: s["kind"] for s in data["sets"]} if isinstance(data.get("sets"), list) else {}
    return [fit_noise_model(profile, runs, measured=name)
            for name, profiles in runs_of(data, where).items() if kinds.get(name) == "compare-pairs"
            for profile, runs in profiles.items()]


def _runs(rows: object, where: str) -> list[Run]:
    if not isinstance(rows, list):
        raise NoiseError(f"{where}: no 'runs' list")
    runs = []
    for i, row in enumerate(rows):
        outcome = row.get("outcome") if isinstance(row, Mapping) else None
        if outcome == "reached":
            runs.append(Run(_seconds(row.get("time_to_target_s"), f"{where} run {i + 1}")))
        elif outcome == "censored":
            runs.append(Run(_seconds(row.get("budget_s"), f"{where} run {i + 1}"), censored=True))
        elif outcome == "failed":
            runs.append(Run(None))
        else:
            raise NoiseError(f"{where} run {i + 1} has outcome {outcome!r}; allowed: reached, censored or failed")
    return runs


def _seconds(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise NoiseError(f"{where}: seconds {value!r}; allowed: a positive number")
    return float(value)
