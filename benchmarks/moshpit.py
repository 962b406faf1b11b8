"""Moshpit averaging, ours against hivemind 1.1.12's DecentralizedAverager, on the same containers and profile.

    .venv/bin/python benchmarks/moshpit.py --peers 4,8 --sizes 1MB,16MB --profile wan-5ms --json results/moshpit.json
    .venv/bin/python benchmarks/moshpit.py --claim --json results/moshpit-claim.json

Averaging (default). For each number of peers ``N = 2^d`` and each vector size, both implementations
average float32 vectors on the ``2^d`` grid (groups of two; hivemind gets the grid through its initial
group bits, :mod:`squall.protocols.moshpit.hivemind_ref`): ``--trials`` trials of ``d`` rounds, each from fresh
random vectors, under ``--profile``. Reported per cell: the median time of one round (matchmaking and
all-reduce, over every peer's rounds) and the largest distance of any peer to the exact mean after the
``d`` rounds (median over trials). Target: our round <= 0.5 x hivemind's, at an equal or lower error.
Waiting limits: ours ``matchmaking_s`` 10 s; hivemind its defaults (``min_matchmaking_time`` 5 s,
``request_timeout`` 3 s) and 30 s per step (a step that finds no group counts as a skipped round).
Both start a full group at once, so these only bound how long a late peer is waited for.
hivemind runs in the ``squall-hivemind`` image, built here on first use from the worker image plus
wheels downloaded on the host with pip (``containers/hivemind/``); ``--no-hivemind`` skips it.

Claim (``--claim``): time to 90 % accuracy of Moshpit SGD against D-PSGD and SGP on 8 workers under
``heterogeneous`` (logistic regression on digits, lr 0.5, evaluation every 5 steps), runs interleaved
over ``--seeds``; the claim is Moshpit's median <= 0.8 x the best baseline's.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from squall.cluster import Cluster, ClusterSpec, Mount  # noqa: E402
from squall.cluster.image import WHEELHOUSE, ensure_variant_image  # noqa: E402
from squall.profiles import load_profile  # noqa: E402
from squall.protocols.dpsgd.protocol import DPSGD  # noqa: E402
from squall.protocols.moshpit.protocol import AVERAGE_JOB, NAME  # noqa: E402
from squall.protocols.sgp.sgd import NAME as SGP  # noqa: E402
from squall.shaping import open_shaper, state_at  # noqa: E402

logger = logging.getLogger("benchmarks.moshpit")

HIVEMIND_DIR = REPO / "containers" / "hivemind"
HIVEMIND_REPO = "squall-hivemind"
#: Packages hivemind needs that PyPI has only as source: made into wheels on the host.
SDIST_ONLY = ("prefetch_generator==1.0.3", "varint==1.0.2", "python-baseconv==1.2.2")
#: Already in the worker image; pinned so pip does not fetch another torch.
IMAGE_PINS = ("torch==2.13.0+cpu", "numpy==2.4.6", "scipy==1.17.1")
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
SPEEDUP_TARGET = 0.5  # our round time / hivemind's
ERROR_SLACK = 1e-6  # float32 rounding: errors below this count as equal
CLAIM_RATIO = 0.8  # Moshpit's time to target / the best gossip baseline's
UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_size(text: str) -> int:
    """``"16MB"`` -> bytes (binary units)."""
    for unit, factor in UNITS.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


# -- the hivemind image ---------------------------------------------------------------------------------
def hivemind_image(client: Any) -> str:
    """The tag of the hivemind image for the current worker image; built if missing."""

    def add_wheels(context: Path) -> None:
        wheels = context / "wheels"
        wheels.mkdir()
        with tempfile.TemporaryDirectory(prefix="squall-hivemind-wheels-") as tmp:
            _download_wheels(Path(tmp), wheels)

    return ensure_variant_image(client, repo=HIVEMIND_REPO, recipe_dir=HIVEMIND_DIR, prepare=add_wheels)


def _download_wheels(tmp: Path, wheels: Path) -> None:
    pip = [sys.executable, "-m", "pip"]
    local = tmp / "local"
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(local), *SDIST_ONLY], check=True)
    constraints = tmp / "constraints.txt"
    constraints.write_text("\n".join(IMAGE_PINS) + "\n")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            *pip,
            "download",
            "-q",
            "-r",
            str(HIVEMIND_DIR / "requirements.txt"),
            "-c",
            str(constraints),
            "--find-links",
            str(WHEELHOUSE),
            "--find-links",
            str(local),
            "-d",
            str(tmp / "all"),
            "--python-version",
            "3.11",
            "--only-binary=:all:",
            *platforms,
        ],
        check=True,
    )
    wanted = {
        _dist(line)
        for line in (HIVEMIND_DIR / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for wheel in (tmp / "all").glob("*.whl"):
        if _dist(wheel.name.split("-")[0]) in wanted:
            shutil.copy(wheel, wheels / wheel.name)


def _dist(name: str) -> str:
    return name.split("==", maxsplit=1)[0].strip().lower().replace("-", "_").replace(".", "_")


# -- averaging ------------------------------------------------------------------------------------------
def run_cell(cluster: Cluster, impl: str, *, size: int, trials: int, port: int, shared: str) -> dict[str, Any]:
    """One implementation, one size, on a started and shaped cluster."""
    peers = len(cluster.nodes)
    config: dict[str, Any] = {"bytes": size, "dtype": "float32", "trials": trials, "seed": 7, "port": port}
    if impl == "hivemind":
        entry = "squall.protocols.moshpit.hivemind_ref:hivemind_average"
        config.update(shared_dir=shared, min_matchmaking_time=5.0, request_timeout=3.0)  # hivemind defaults
    else:
        entry = AVERAGE_JOB
        config.update(group_size=2, matchmaking_s=10.0)
    t0 = time.monotonic()
    results = cluster.run_job(entry, config, timeout=600, raise_on_failure=False)
    wall = time.monotonic() - t0
    bad = [r.describe() for r in results if not r.ok]
    if bad:
        return {"impl": impl, "peers": peers, "bytes": size, "error": bad}
    values = [r.value for r in results]
    rounds = [t for v in values for t in v["round_s"]]
    groups = [
        len(rec["group"]) if isinstance(rec["group"], list) else rec["group"] for r in results for rec in r.metrics()
    ]
    errors = [max(v["final_errors"][k] for v in values) for k in range(trials)]
    return {
        "impl": impl,
        "peers": peers,
        "bytes": size,
        "trials": trials,
        "rounds_per_trial": values[0]["rounds"],
        "round_median_s": statistics.median(rounds),
        "round_p90_s": sorted(rounds)[int(0.9 * (len(rounds) - 1))],
        "final_error_median": statistics.median(errors),
        "final_error_max": max(errors),
        "job_wall_s": wall,
        "rounds_in_a_full_group": sum(g == 2 for g in groups) / max(1, len(groups)),
    }


def averaging(args: argparse.Namespace) -> dict[str, Any]:
    """Every (peers, implementation, size) cell."""
    from squall.cluster.engine import docker_client

    client = docker_client()
    impls = [NAME] + ([] if args.no_hivemind else ["hivemind"])
    images = {NAME: None, "hivemind": hivemind_image(client) if "hivemind" in impls else None}
    profile = load_profile(args.profile)
    cells: list[dict[str, Any]] = []
    port = 29700
    for peers in args.peers:
        for impl in impls:
            with tempfile.TemporaryDirectory(prefix="sq-mp-", dir="/tmp") as shared:
                spec = ClusterSpec(
                    workers=peers,
                    cpus=1.0,
                    memory="1g",
                    image=images[impl],
                    mounts=(Mount(shared, "/squall/shared", read_only=False),),
                )
                with Cluster(spec, client=client) as cluster:
                    shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id)
                    try:
                        shaper.apply(state_at(profile, peers, 0.0))
                        for size in args.sizes:
                            port += 1
                            cell = run_cell(
                                cluster, impl, size=size, trials=args.trials, port=port, shared="/squall/shared"
                            )
                            cell.update(profile=profile.name, backend=shaper.backend)
                            logger.info("%s", cell)
                            cells.append(cell)
                        shaper.check()
                    finally:
                        shaper.close()
    return {"kind": "averaging", "profile": profile.name, "cells": cells, "verdicts": verdicts(cells)}


def verdicts(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours against hivemind in each (peers, size): round-time ratio and error comparison."""
    out = []
    by_key = {(c["impl"], c["peers"], c["bytes"]): c for c in cells if "error" not in c}
    for (impl, peers, size), ours in by_key.items():
        ref = by_key.get(("hivemind", peers, size))
        if impl != NAME or ref is None:
            continue
        ratio = ours["round_median_s"] / ref["round_median_s"]
        error_ok = ours["final_error_median"] <= ref["final_error_median"] + ERROR_SLACK
        out.append(
            {
                "peers": peers,
                "bytes": size,
                "round_ratio": ratio,
                "error_ok": error_ok,
                "met": ratio <= SPEEDUP_TARGET and error_ok,
            }
        )
    return out


def print_averaging(report: dict[str, Any]) -> None:
    print(f"profile {report['profile']}")
    print(
        f"{'impl':<9} {'peers':>5} {'size':>8} {'round p50':>10} {'round p90':>10} {'error p50':>10} {'error max':>10}"
    )
    for c in report["cells"]:
        if "error" in c:
            print(f"{c['impl']:<9} {c['peers']:>5} {c['bytes']:>8} FAILED: {c['error'][0][:80]}")
            continue
        print(
            f"{c['impl']:<9} {c['peers']:>5} {c['bytes'] >> 20:>6}MB {c['round_median_s']:>10.3f} "
            f"{c['round_p90_s']:>10.3f} {c['final_error_median']:>10.2e} {c['final_error_max']:>10.2e}"
        )
    for v in report["verdicts"]:
        print(
            f"peers {v['peers']} size {v['bytes'] >> 20}MB: ours/hivemind round time {v['round_ratio']:.2f} "
            f"(target <= {SPEEDUP_TARGET}), error {'equal or lower' if v['error_ok'] else 'HIGHER'}: "
            f"{'met' if v['met'] else 'MISSED'}"
        )


# -- the claim ------------------------------------------------------------------------------------------
def claim(args: argparse.Namespace) -> dict[str, Any]:
    """Time to target of moshpit, dpsgd and sgp under heterogeneous, interleaved over seeds."""
    from squall.checks import Target, time_to_target
    from squall.experiment.lab import Lab, RunSpec

    protocols = (NAME, DPSGD, SGP)
    target = Target("accuracy", 0.9)
    times: dict[str, list[float | None]] = {p: [] for p in protocols}
    with Lab(workers=8) as lab:
        for seed in args.seeds:
            for protocol in protocols:
                trace = lab.run(
                    RunSpec(
                        protocol,
                        "heterogeneous",
                        seed=seed,
                        seconds=40,
                        lr=0.5,
                        target=Target("accuracy", 0.9),
                        config={"eval_every": 5},
                    )
                )
                times[protocol].append(time_to_target(trace, target))
                logger.info("%s seed %d: time to target %s", protocol, seed, times[protocol][-1])
    medians = {p: statistics.median([t if t is not None else float("inf") for t in v]) for p, v in times.items()}
    best = min(medians[DPSGD], medians[SGP])
    ratio = medians[NAME] / best
    return {
        "kind": "claim",
        "profile": "heterogeneous",
        "workers": 8,
        "seeds": list(args.seeds),
        "time_to_target_s": times,
        "median_s": medians,
        "ratio_to_best_gossip": ratio,
        "at_most": CLAIM_RATIO,
        "met": ratio <= CLAIM_RATIO,
    }


def print_claim(report: dict[str, Any]) -> None:
    for protocol, values in report["time_to_target_s"].items():
        shown = ", ".join("n/a" if v is None else f"{v:.2f}" for v in values)
        print(f"{protocol:<8} time to 90 %: {shown} s   median {report['median_s'][protocol]:.2f} s")
    print(
        f"moshpit / best gossip baseline = {report['ratio_to_best_gossip']:.2f} "
        f"(claim <= {CLAIM_RATIO}): {'met' if report['met'] else 'MISSED'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=lambda s: [int(p) for p in s.split(",")], default=[4, 8])
    parser.add_argument("--sizes", type=lambda s: [parse_size(p) for p in s.split(",")], default=[1 << 20, 16 << 20])
    parser.add_argument("--profile", default="wan-5ms")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--no-hivemind", action="store_true", help="measure only our implementation")
    parser.add_argument("--claim", action="store_true", help="measure the time-to-target claim instead")
    parser.add_argument("--seeds", type=lambda s: [int(p) for p in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("squall.shaping", "squall.cluster"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = claim(args) if args.claim else averaging(args)
    (print_claim if args.claim else print_averaging)(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
