"""How many runs `squall compare` needs here: the runs per side that find a 5, 10 or 20 % slow-down.

    .venv/bin/python benchmarks/compare_power.py                       # the table
    .venv/bin/python benchmarks/compare_power.py --json results/compare-power.json --comparisons 2000

No containers: pure simulation. For each profile of each set of A/A pairs in
``squall/compare/noise_model.json`` (the DDP example's runs under ``squall compare``, measured here
and stored by ``benchmarks/compare_noise.py``), the noise model is fitted
(:func:`squall.compare.noise.fit_noise_model`) and thousands of comparisons are drawn from it and
judged by :func:`squall.compare.stats.compare_samples`, as ``squall compare`` judges its runs:

* the false-alarm rate (an A/A comparison said ``worse``) at 5 pairs, and with early stopping (5
  pairs, then up to 10 until decided);
* the detection rate of a 20 % slow-down at 5 pairs, and with early stopping;
* for each difference, the fewest pairs (runs per side) at which ``worse`` comes out in 80 % of the
  comparisons (the false-alarm rate stays at 2.5 % or below at every size: the interval's design).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from squall.compare.noise import NoiseModel, fit_noise_model, models_of, runs_of  # noqa: E402
from squall.compare.power import POWER, runs_needed, verdict_rates  # noqa: E402

DATA = REPO / "squall" / "compare" / "noise_model.json"
DIFFERENCES = (0.05, 0.10, 0.20)
logger = logging.getLogger("bench.compare_power")


def profile_row(model: NoiseModel, *, comparisons: int, most: int, seed: int) -> dict[str, Any]:
    """One profile's fitted model, error rates and runs needed."""
    rng = np.random.default_rng(seed)
    aa = verdict_rates(model, rng, comparisons=comparisons, pairs=5)
    aa_seq = verdict_rates(model, rng, comparisons=comparisons, pairs=5, max_runs=10)
    slow = verdict_rates(model, rng, comparisons=comparisons, pairs=5, ratio=1.2)
    slow_seq = verdict_rates(model, rng, comparisons=comparisons, pairs=5, max_runs=10, ratio=1.2)
    needed = {f"{int(100 * d)}%": runs_needed(model, rng, ratio=1 + d, comparisons=comparisons, most=most)
              for d in DIFFERENCES}
    logger.info("%s (%s) done", model.profile, model.measured)
    return {"profile": model.profile, "measured": model.measured, "model": model.__dict__, "false_alarm_5": aa.worse,
            "false_alarm_5_to_10": aa_seq.worse, "detect_20_at_5": slow.worse, "detect_20_at_5_to_10": slow_seq.worse,
            "mean_pairs_20_at_5_to_10": slow_seq.mean_pairs, "runs_needed": needed}


def table(rows: list[dict[str, Any]], most: int) -> str:
    def n(x: int | None) -> str:
        return f"> {most}" if x is None else str(x)

    head = ("| profile (set) | median s | sigma | stalls | false alarm (5; 5-10) | 20 % found (5; 5-10) | "
            + " | ".join(f"{int(100 * d)} %" for d in DIFFERENCES) + " |")
    lines = [head, "|" + "---|" * (6 + len(DIFFERENCES))]
    for r in rows:
        m = r["model"]
        lines.append(f"| {r['profile']} ({r['measured']}) | {m['median_s']:.2f} | {100 * m['sigma']:.1f} % | "
                     f"{100 * m['tail_p']:.0f} % x {100 * m['tail_mean']:.0f} % | "
                     f"{100 * r['false_alarm_5']:.1f} %; {100 * r['false_alarm_5_to_10']:.1f} % | "
                     f"{100 * r['detect_20_at_5']:.0f} %; {100 * r['detect_20_at_5_to_10']:.0f} % | "
                     + " | ".join(n(v) for v in r["runs_needed"].values()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="measured runs (benchmarks/compare_noise.py)")
    parser.add_argument("--comparisons", type=int, default=1000, help="simulated comparisons per figure")
    parser.add_argument("--most", type=int, default=64, help="the most runs per side tried")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--separate", action="store_true",
                        help="also the sets of separate runs (each on a fresh cluster), as if they were pairs")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    raw = json.loads(args.data.read_text())
    models = models_of(raw, str(args.data))
    if args.separate:  # separate runs read as if consecutive ones were pairs: what pairing on one cluster saves
        kinds = {s["name"]: s["kind"] for s in raw["sets"]}
        models += [fit_noise_model(profile, runs, measured=f"{name}, unpaired")
                   for name, profiles in runs_of(raw, str(args.data)).items() if kinds[name] == "separate-runs"
                   for profile, runs in profiles.items()]
    rows = [profile_row(model, comparisons=args.comparisons, most=args.most, seed=args.seed) for model in models]
    print(f"Runs per side for {100 * POWER:.0f} % detection of a slow-down (worse), "
          f"{args.comparisons} simulated comparisons per figure")
    print(table(rows, args.most))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"data": str(args.data), "sets": [{k: v for k, v in s.items() if k != "profiles"} for s in raw["sets"]],
               "comparisons": args.comparisons, "profiles": rows}
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
