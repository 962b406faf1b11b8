r"""Run-to-run variation of the DDP example on this host: the raw figures `squall compare`'s noise model is fitted to.

    .venv/bin/python benchmarks/compare_noise.py --profiles thin-20mbit,lossy-1pct --runs 10 \
        --json squall/compare/noise_model.json

Each run is one ``squall run --workers 4 --profile P --json -- python train.py --steps 40`` from
``docs/examples/ddp`` (the same seed every time), on a fresh cluster, one after the other, profile by
profile. From each run's JSON it keeps the time to ``loss <= 1.2`` (or ``None`` with a reason when the
run failed or never reached it), the median interval between consecutive steps (over every rank's
``step N loss X`` lines), and the bytes all ranks sent, in total and by the target. Consecutive runs
(1 and 2, 3 and 4, ...) of one profile are A/A pairs: they ran next to each other with the same
command and seed, as `squall compare` pairs a baseline run with the candidate run beside it.

What else the host was doing is written beside every run: the 1-minute load average before and
after, and the processes using the most CPU at the start (other engineers share the 2 cores).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "ddp"
SQUALL = REPO / ".venv" / "bin" / "squall"
METRIC = r"loss=step (?P<step>\d+) loss (?P<value>\S+)"
TARGET = "loss<=1.2"
STEPS = 40

log = logging.getLogger("compare_noise")


def busiest(n: int = 5) -> list[str]:
    """The ``n`` processes using the most CPU right now (ps's lifetime average), as 'pcpu command'."""
    out = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True, text=True,
                         check=False).stdout
    return [" ".join(line.split()) for line in out.splitlines()[:n]]


def median_step_interval(metrics: list[dict[str, Any]]) -> float | None:
    """The median of every rank's intervals between consecutive steps, or None with fewer than two steps."""
    by_rank: dict[int, list[tuple[int, float]]] = {}
    for rec in metrics:
        if rec.get("step") is not None:
            by_rank.setdefault(int(rec["rank"]), []).append((int(rec["step"]), float(rec["t"])))
    gaps = [b[1] - a[1] for recs in map(sorted, by_rank.values()) for a, b in itertools.pairwise(recs)
            if b[0] == a[0] + 1]
    return statistics.median(gaps) if gaps else None


def one_run(profile: str, seconds: float, workdir: Path) -> dict[str, Any]:
    """One ``squall run`` of the example; its figures, or None and the reason for what it did not give."""
    load_before = os.getloadavg()[0]
    beside = busiest()
    cmd = [str(SQUALL), "run", "--workers", "4", "--profile", profile, "--metric", METRIC, "--target", TARGET,
           "--seconds", str(seconds), "--json", "--report", str(workdir / "report"), "--",
           "python", "train.py", "--steps", str(STEPS)]
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    proc = subprocess.run(cmd, cwd=EXAMPLE, capture_output=True, text=True, check=False)
    row: dict[str, Any] = {"started": started, "budget_s": seconds, "exit_code": proc.returncode,
                           "load1_before": round(load_before, 2),
                           "load1_after": round(os.getloadavg()[0], 2), "busiest_at_start": beside}
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        row.update(time_to_target_s=None, outcome="failed", why=proc.stderr.strip().splitlines()[-1:])
        return row
    ttt = out.get("time_to_target_s")
    row.update(
        time_to_target_s=ttt,
        outcome="reached" if ttt is not None else ("censored" if out.get("verdict") == "fail" and all(
            r.get("exit_code") == 0 or r.get("state") == "budget" for r in out.get("ranks", [])) else "failed"),
        why=out.get("why"),
        median_step_interval_s=median_step_interval(out.get("metrics", {}).get("loss", [])),
        bytes_sent_total=sum(out.get("bytes_sent") or []) or None,
        bytes_to_target_total=sum(out.get("bytes_to_target") or []) or None,
        duration_s=out.get("duration_s"),
        backend=out.get("backend"),
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="thin-20mbit,lossy-1pct")
    parser.add_argument("--runs", type=int, default=10, help="runs per profile (an even number: A/A pairs)")
    parser.add_argument("--seconds", type=float, default=120.0, help="each run's budget")
    parser.add_argument("--note", default="", help="what else ran on the host, in words")
    parser.add_argument("--json", type=Path, required=True, help="where to write the raw figures")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    data: dict[str, Any] = {
        "what": "run-to-run variation of docs/examples/ddp/train.py under squall run, fitted by "
                "squall.compare.noise.fit_noise_model",
        "how": {"command": f"squall run --workers 4 --profile P --metric '{METRIC}' --target '{TARGET}' "
                           f"--seconds {args.seconds:g} --json -- python train.py --steps {STEPS}",
                "cwd": "docs/examples/ddp", "runs_per_profile": args.runs,
                "pairs": "consecutive runs of one profile (1-2, 3-4, ...) are A/A pairs",
                "measured_by": "benchmarks/compare_noise.py"},
        "host": {"date": dt.date.today().isoformat(), "machine": platform.machine(), "kernel": platform.release(),
                 "cpus": os.cpu_count(), "commit": commit, "beside": args.note},
        "profiles": {},
    }
    for profile in args.profiles.split(","):
        rows = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="squall-noise-") as tmp:
                row = one_run(profile, args.seconds, Path(tmp))
            log.info("%s run %d: %s s (%s), step %s s, load %.2f", profile, i + 1, row.get("time_to_target_s"),
                     row["outcome"], row.get("median_step_interval_s"), row["load1_before"])
            rows.append(row)
            data["profiles"][profile] = {"runs": rows}
            args.json.write_text(json.dumps(data, indent=1) + "\n")  # after every run: a crash keeps what ran
    json.dump({p: [r.get("time_to_target_s") for r in v["runs"]] for p, v in data["profiles"].items()}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
