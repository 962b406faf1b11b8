r"""Run-to-run variation of the DDP example on this host: the raw figures `squall compare`'s noise model is fitted to.

Two ways to measure, each written as one *set* into ``squall/compare/noise_model.json`` (a set with
the same name is replaced; the others are kept):

    # A/A pairs as squall compare runs them (the model's source): the same command on both sides
    cd docs/examples/ddp && squall compare --baseline 'python train.py --steps 40' \
        --candidate 'python train.py --steps 40' --profile thin-20mbit --profile lossy-1pct --runs 8 \
        --seconds 120 --metric 'loss=step (?P<step>\d+) loss (?P<value>\S+)' --target 'loss<=1.2' --json > aa.json
    .venv/bin/python benchmarks/compare_noise.py add-compare aa.json --name pairs-busy --note "what ran beside"

    # separate runs, each on a fresh cluster with squall run (the spread that pairing removes)
    .venv/bin/python benchmarks/compare_noise.py measure --profiles thin-20mbit,lossy-1pct --runs 10 --name runs-busy

A set's profiles hold every run in the order it ran; consecutive runs (1-2, 3-4, ...) are A/A pairs:
for ``add-compare`` the pairs squall compare ran (ABBA, on one cluster, one seed per pair); for
``measure`` two ``squall run`` in a row. Each run keeps its time to ``loss <= 1.2`` (its budget when
censored, nothing when failed), its median interval between steps and the bytes sent. What else the
host was doing is written beside: load averages and, for ``measure``, the busiest processes per run.
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
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "ddp"
DATA = REPO / "squall" / "compare" / "noise_model.json"
SQUALL = REPO / ".venv" / "bin" / "squall"
METRIC = r"loss=step (?P<step>\d+) loss (?P<value>\S+)"
TARGET = "loss<=1.2"
STEPS = 40
ENVIRONMENT_NOT_READY = 3  # squall run's exit code when the engine or the worker image is not ready

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
    if proc.returncode == ENVIRONMENT_NOT_READY:  # no run at all: not a failed run of the program
        raise SystemExit(f"squall run exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
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


def _host(note: str) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    return {"date": dt.date.today().isoformat(), "machine": platform.machine(), "kernel": platform.release(),
            "cpus": os.cpu_count(), "commit": commit, "beside": note}


def _store(path: Path, new: dict[str, Any]) -> None:
    """Write ``new`` into the data file, replacing the set of the same name."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("what", "run-to-run variation of docs/examples/ddp/train.py on this host, in sets; "
                            "squall/compare/noise.py fits its model to the sets of A/A pairs squall compare ran")
    data["measured_by"] = "benchmarks/compare_noise.py"
    data["sets"] = [s for s in data.get("sets", []) if s["name"] != new["name"]] + [new]
    path.write_text(json.dumps(data, indent=1) + "\n")


def measure(args: argparse.Namespace) -> None:
    """Separate ``squall run`` of each profile, one after the other."""
    new: dict[str, Any] = {
        "name": args.name, "kind": "separate-runs",
        "how": f"squall run --workers 4 --profile P --metric '{METRIC}' --target '{TARGET}' --seconds {args.seconds:g} "
               f"--json -- python train.py --steps {STEPS} (in docs/examples/ddp), each on a fresh cluster",
        "host": _host(args.note), "profiles": {}}
    for profile in args.profiles.split(","):
        rows = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="squall-noise-") as tmp:
                row = one_run(profile, args.seconds, Path(tmp))
            log.info("%s run %d: %s s (%s), step %s s, load %.2f", profile, i + 1, row.get("time_to_target_s"),
                     row["outcome"], row.get("median_step_interval_s"), row["load1_before"])
            rows.append(row)
            new["profiles"][profile] = {"runs": rows}
            _store(args.data, new)  # after every run: a crash keeps what ran


def add_compare(args: argparse.Namespace) -> None:
    """The runs of a ``squall compare --json`` A/A comparison, in the order they ran."""
    out = json.loads(args.compare.read_text())
    if out.get("baseline") != out.get("candidate"):
        raise SystemExit(f"{args.compare}: baseline {out.get('baseline')!r} and candidate {out.get('candidate')!r} "
                         "differ; allowed: an A/A comparison (the same command on both sides)")
    meta = out.get("meta", {})
    prov = meta.get("provenance", {})
    new: dict[str, Any] = {
        "name": args.name, "kind": "compare-pairs", "how": meta.get("command"),
        "host": {**_host(args.note), "date": str(prov.get("started_utc", ""))[:10] or dt.date.today().isoformat(),
                 "started_utc": prov.get("started_utc"), "commit": str(prov.get("commit", ""))[:7],
                 "load_before": prov.get("load_before"), "load_after": prov.get("load_after"),
                 "shaping": meta.get("shaping backend")},
        "profiles": {}}
    for entry in out["profiles"]:
        m = entry["measures"]
        ttt = m["time_to_target_s"]
        rows = []
        for run in entry["runs"]:
            side, k = run["side"], run["pair"]
            value, censored = ttt[side][k], ttt[f"{side}_censored"][k]
            row: dict[str, Any] = {"pair": k, "side": side, "budget_s": out.get("seconds") or args.seconds,
                                   "outcome": "failed" if value is None else "censored" if censored else "reached",
                                   "time_to_target_s": None if censored else value}
            for name in ("step_interval_s", "bytes_sent", "bytes_to_target"):
                if name in m:
                    row[name] = m[name][side][k]
            rows.append(row)
        new["profiles"][entry["profile"]] = {"runs": rows}
    _store(args.data, new)
    log.info("set %s: %s", args.name, {p: len(v["runs"]) for p, v in new["profiles"].items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the data file the set is written into")
    sub = parser.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("measure", help="separate squall run of each profile")
    m.add_argument("--profiles", default="thin-20mbit,lossy-1pct")
    m.add_argument("--runs", type=int, default=10, help="runs per profile (an even number: A/A pairs)")
    m.add_argument("--seconds", type=float, default=120.0, help="each run's budget")
    a = sub.add_parser("add-compare", help="the runs of a squall compare --json A/A comparison")
    a.add_argument("compare", type=Path, help="squall compare --json output")
    a.add_argument("--seconds", type=float, default=120.0, help="the runs' budget (--seconds given to compare)")
    for p in (m, a):
        p.add_argument("--name", required=True, help="the set's name, e.g. pairs-busy")
        p.add_argument("--note", default="", help="what else ran on the host, in words")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    {"measure": measure, "add-compare": add_compare}[args.mode](args)


if __name__ == "__main__":
    main()
