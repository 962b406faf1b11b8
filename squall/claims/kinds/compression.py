"""Compressed communication's pure-maths claims, measured in-process (no containers).

The claims: docs/protocols/compression.md and docs/protocols/lowbit.md.

Each kind calls the protocol's own experiment function, named in ``params`` as
``"package.module:function"`` (so the claim tests the code the workers run and this module names no
protocol):

* ``sketch_contraction`` (T6.1): ``params.alignment`` ``fn(workers, rows, cols, ratio, rank, seed) ->
  int`` (distinct row selections among the workers, 1 when aligned) and ``params.trials_fn``
  ``fn(trials, workers, rows, cols, ratio, rank, slack, spread, seed)`` returning ``exact_max`` (the
  largest ``||C(G) - G||^2 / ((1 - k/rows) ||G||^2)`` with an exact sketch, must be <= 1) and
  ``sketch_within`` (the fraction of trials where a rank-``r`` sketch's ratio is within ``slack``,
  must be >= ``at_least``);
* ``heterogeneous_synthetic`` (T6.2): ``params.distance`` ``fn(variant, ratio, seed) -> float``, the
  distance to the optimum after the run; for each of ``params.ratios`` the compressed variant
  (``params.variant``) must be <= ``params.vs_local`` x the local Top-K's and <= ``params.vs_uncompressed``
  x the uncompressed run's;
* ``quantized_error`` (T8.1): ``params.error`` ``fn(collective, world, bits, seed) -> float``, the
  relative error of a low-bit all-reduce of Gaussians; ``fast`` is the two-step collective, ``slow``
  the per-hop ring: INT8 <= ``params.int8_max`` and INT4 <= ``params.int4_max`` for ``fast`` at every
  world size of ``params.ranks``, ``fast``'s error(last)/error(first) <= ``params.flat_max`` and
  ``slow``'s >= ``params.growth_min``;
* ``quantized_inference`` (T8.3): ``params.accuracy`` ``fn(bits, world, seed) -> float``, held-out accuracy
  of a row-parallel model whose all-reduce is quantized to ``bits`` (None: exact); the drop from
  exact to INT8 must be <= ``params.int8_max_drop`` and to INT4 <= ``params.int4_max_drop``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from squall.checks import Verdict
from squall.claims.kinds.base import Claim, ClaimKind, Runner
from squall.claims.kinds.unbiased import load

CONTRACTION = {"workers": 8, "rows": 64, "cols": 16, "ratio": 0.125, "rank": 4, "slack": 1.1, "trials": 1000,
               "spread": 0.0, "seed": 2}
SYNTHETIC = {"ratios": [0.01, 0.05], "vs_local": 0.1, "vs_uncompressed": 10.0, "seed": 0}
#: The variants' names as the distance function knows them (the claim gives them).
VARIANT_KEYS = frozenset({"variant", "local", "uncompressed"})
INFERENCE = {"world": 4, "int8_max_drop": 0.005, "int4_max_drop": 0.02, "seed": 0}
QUANT = {"ranks": [2, 4, 16], "int8_max": 0.015, "int4_max": 0.20, "flat_max": 1.2, "growth_min": 1.5, "seed": 0}


def _fn(params: dict[str, Any], key: str) -> Callable[..., Any]:
    try:
        return load(str(params[key]))
    except ValueError as exc:
        raise ValueError(str(exc).replace("params.estimators", f"params.{key}")) from None


def sketch_contraction(claim: Claim, run: Runner) -> Verdict:
    """T6.1 checks 1-3 (``run`` is not used)."""
    p = {**CONTRACTION, **claim.params}
    shape = {k: p[k] for k in ("workers", "rows", "cols", "ratio", "rank")}
    distinct = int(_fn(p, "alignment")(**shape, seed=int(p["seed"])))
    trials = _fn(p, "trials_fn")(trials=int(p["trials"]), slack=float(p["slack"]), spread=float(p["spread"]),
                                 seed=int(p["seed"]), **shape)
    within = float(trials.sketch_within)
    at_least = claim.at_least if claim.at_least is not None else 0.95
    measured = {"distinct_selections": distinct, "exact_max": round(float(trials.exact_max), 4),
                "sketch_within": round(within, 4), "sketch_median": round(float(trials.sketch_median), 4)}
    expected = (f"1 row set on all {p['workers']} workers; exact sketch ratio <= 1 in every trial; rank-{p['rank']} "
                f"ratio <= {p['slack']} in >= {at_least:.0%} of {p['trials']} trials")
    failed = [what for what, ok in (("alignment", distinct == 1), ("exact contraction", trials.exact_max <= 1 + 1e-9),
                                    ("sketch slack", within >= at_least)) if not ok]
    return Verdict("sketch_contraction", not failed, measured, expected,
                   "all hold" if not failed else "failed: " + ", ".join(failed))


def heterogeneous_synthetic(claim: Claim, run: Runner) -> Verdict:
    """T6.2 (``run`` is not used)."""
    p = {**SYNTHETIC, **claim.params}
    distance = _fn(p, "distance")
    measured: dict[str, Any] = {}
    failed = []
    for ratio in p["ratios"]:
        d = {name: float(distance(p[name], float(ratio), seed=int(p["seed"])))
             for name in ("variant", "local", "uncompressed")}
        measured[f"k={ratio:g}"] = {p[name]: round(v, 5) for name, v in d.items()}
        if not d["variant"] <= float(p["vs_local"]) * d["local"]:
            failed.append(f"k={ratio:g}: {d['variant']:.4g} > {p['vs_local']} x local {d['local']:.4g}")
        if not d["variant"] <= float(p["vs_uncompressed"]) * d["uncompressed"]:
            failed.append(f"k={ratio:g}: {d['variant']:.4g} > {p['vs_uncompressed']} x uncompressed "
                          f"{d['uncompressed']:.4g}")
    expected = (f"{p['variant']} distance <= {p['vs_local']} x {p['local']} and <= {p['vs_uncompressed']} x "
                f"{p['uncompressed']} at ratios {p['ratios']}")
    return Verdict("heterogeneous_synthetic", not failed, measured, expected,
                   "all hold" if not failed else "; ".join(failed))


def quantized_error(claim: Claim, run: Runner) -> Verdict:
    """T8.1 (``run`` is not used)."""
    p = {**QUANT, **claim.params}
    error = _fn(p, "error")
    ranks = [int(r) for r in p["ranks"]]
    seed = int(p["seed"])
    figures = {(c, b, w): float(error(c, world=w, bits=b, seed=seed + w))
               for c in (claim.fast, claim.slow) for b in (8, 4) for w in ranks}
    first, last = ranks[0], ranks[-1]
    failed = []
    for bits, limit in ((8, float(p["int8_max"])), (4, float(p["int4_max"]))):
        worst = max(figures[(claim.fast, bits, w)] for w in ranks)
        if worst > limit:
            failed.append(f"INT{bits} error {worst:.4f} > {limit}")
        flat = figures[(claim.fast, bits, last)] / figures[(claim.fast, bits, first)]
        if flat > float(p["flat_max"]):
            failed.append(f"INT{bits} {claim.fast} err({last})/err({first}) = {flat:.3f} > {p['flat_max']}")
        growth = figures[(claim.slow, bits, last)] / figures[(claim.slow, bits, first)]
        if growth < float(p["growth_min"]):
            failed.append(f"INT{bits} {claim.slow} err({last})/err({first}) = {growth:.3f} < {p['growth_min']}")
    measured = {f"{c} INT{b} p={w}": round(v, 5) for (c, b, w), v in figures.items()}
    expected = (f"{claim.fast}: INT8 <= {p['int8_max']}, INT4 <= {p['int4_max']}, err({last})/err({first}) <= "
                f"{p['flat_max']}; {claim.slow}: err({last})/err({first}) >= {p['growth_min']}")
    return Verdict("quantized_error", not failed, measured, expected, "all hold" if not failed else "; ".join(failed))


def quantized_inference(claim: Claim, run: Runner) -> Verdict:
    """T8.3 (``run`` is not used)."""
    p = {**INFERENCE, **claim.params}
    accuracy = _fn(p, "accuracy")
    world, seed = int(p["world"]), int(p["seed"])
    figures = {bits: float(accuracy(bits, world=world, seed=seed)) for bits in (None, 8, 4)}
    drops = {8: figures[None] - figures[8], 4: figures[None] - figures[4]}
    limits = {8: float(p["int8_max_drop"]), 4: float(p["int4_max_drop"])}
    failed = [f"INT{b} drop {drops[b]:.4f} > {limits[b]}" for b in (8, 4) if drops[b] > limits[b]]
    measured = {"exact": round(figures[None], 4), "int8": round(figures[8], 4), "int4": round(figures[4], 4)}
    expected = f"accuracy drop <= {limits[8]} (INT8) and <= {limits[4]} (INT4) over {world} ranks"
    why = "all hold" if not failed else "; ".join(failed)
    return Verdict("quantized_inference", not failed, measured, expected, why)


KINDS = (
    ClaimKind("sketch_contraction", frozenset(), sketch_contraction, accepts=frozenset({"at_least"}),
              params=frozenset({*CONTRACTION, "alignment", "trials_fn"}),
              required_params=frozenset({"alignment", "trials_fn"})),
    ClaimKind("heterogeneous_synthetic", frozenset(), heterogeneous_synthetic,
              params=frozenset({*SYNTHETIC, *VARIANT_KEYS, "distance"}),
              required_params=frozenset({*VARIANT_KEYS, "distance"})),
    ClaimKind("quantized_error", frozenset({"fast", "slow"}), quantized_error,
              params=frozenset({*QUANT, "error"}), required_params=frozenset({"error"})),
    ClaimKind("quantized_inference", frozenset(), quantized_inference,
              params=frozenset({*INFERENCE, "accuracy"}), required_params=frozenset({"accuracy"})),
)
