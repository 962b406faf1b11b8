"""All-reduce benchmark: our ring and butterfly against gloo, on the same shaped containers.

    .venv/bin/python benchmarks/allreduce.py --workers 4,8 --sizes 4KB,1MB,16MB,64MB \\
        --profiles lan,wan-5ms,thin-100mbit --json results/bench-allreduce.json
    .venv/bin/python benchmarks/allreduce.py --quick            # fewer repetitions, same table
    .venv/bin/python benchmarks/allreduce.py --loopback --workers 4 --sizes 1MB,16MB   # no Docker

For each worker count one cluster is started; for each profile its links are shaped (the same
containers are reshaped between profiles), then for each size the job ``allreduce_bench`` times
our ring and butterfly (:mod:`squall.bench.allreduce`) and the job ``gloo_allreduce``
times ``torch.distributed`` with gloo (:mod:`squall.protocols.baselines.gloo`), one after the other on
the same containers. Sizes are binary (``1MB`` = 2**20 bytes) float32 tensors.

Reported per row: the slowest rank's median time, bus bandwidth ``2 (n-1)/n S / t``, the ratio to
gloo's time, and the ratio to the alpha-beta bound of the algorithm
(:mod:`squall.collectives.cost`) with alpha = the profile's one-way delay and B = its link rate
(for gloo, which runs a ring, the ring's bound). A chunk-pipelined ring overlaps the ``alpha`` of
consecutive steps, so it can finish below the bound when alpha dominates.

Targets (the issue): ring <= 1.15 x gloo's time for sizes >= 1 MB on every profile; butterfly
<= 0.6 x gloo's time for 4 KB..1 MB at wan-5ms with 8 workers; ring bus bandwidth >= 85 % of the
link rate for 64 MB at thin-100mbit.

Repetitions. Each (size, algorithm) gets as many timed calls as fit ``--budget`` seconds by the
ring's model time, between 3 and ``--repetitions``, split over ``--rounds`` alternating rounds
(ours, gloo, gloo, ours, ...) so that a background load that drifts during a cell hits both
alike; each job starts with one or two untimed warm-up calls. A row's time is the slowest rank's
median over all its calls (gloo's ``median_s_max``). ``--quick``: one round of 3 calls.

``--paired`` times gloo inside the ``allreduce_bench`` job instead (``dist.all_reduce`` in a gloo
group of the same processes, call by call between ours), so every comparison shares one moment
of the host's load; on a host that others load unevenly this is the steadier comparison.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.cluster import Cluster, ClusterSpec, Mount
from squall.cluster.cluster import SRC_MOUNT
from squall.collectives.cost import LinkModel, doubling_time, rabenseifner_time, ring_time
from squall.profiles import load_profile
from squall.protocols.baselines.protocol import ALLREDUCE_JOB as GLOO_ALLREDUCE_JOB
from squall.shaping import LinkState, open_shaper, state_at

logger = logging.getLogger("bench.allreduce")

RING_VS_GLOO = 1.15  # ring time / gloo time, sizes >= 1 MB, every profile
BUTTERFLY_VS_GLOO = 0.6  # butterfly time / gloo time, 4 KB..1 MB, wan-5ms, 8 workers
THIN_LINK_SHARE = 0.85  # ring bus bandwidth / link rate, 64 MB, thin-100mbit
GLOO_PORT = 29510
OURS_PORT = 29610
LOOPBACK = LinkModel(alpha=2e-5, bandwidth=2e9)  # nominal, only for the bound column
CODE_MOUNT = "/squall/code"  # where --code is mounted
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMG]?)i?B?$", re.IGNORECASE)

#: Runs one job on every node with a config and a timeout; returns each rank's (value, metrics records).
RunJob = Callable[[str, dict[str, Any], float], list[tuple[dict[str, Any], list[dict[str, Any]]]]]


def parse_size(text: str) -> int:
    """``4KB``, ``1MB``, ``16MiB``, ``512`` -> bytes (binary multiples)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; write e.g. 4KB, 1MB, 64MB")
    scale = 1024 ** " KMG".index((match.group(2) or " ").upper())
    return int(float(match.group(1)) * scale)


def size_label(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def link_of(state: LinkState) -> LinkModel:
    """The alpha-beta link of a shaped state: the largest one-way delay and the lowest rate."""
    specs = list(state.links.values())
    alpha = max(s.delay_us for s in specs) / 1e6
    rates = [s.rate_bps for s in specs if s.rate_bps]
    return LinkModel(alpha=alpha, bandwidth=min(rates) / 8 if rates else LOOPBACK.bandwidth)


def bound_s(algorithm: str, variant: str | None, n: int, nbytes: int, link: LinkModel) -> float:
    """The alpha-beta time of what ran (gloo runs a ring)."""
    if algorithm == "butterfly":
        return (doubling_time if variant == "doubling" else rabenseifner_time)(n, nbytes, link)
    return ring_time(n, nbytes, link)


@dataclass(frozen=True)
class Plan:
    """How many calls each size gets, in how many alternating rounds, and our ring's chunk size."""

    repetitions: int  # at most this many timed calls per (size, algorithm), all rounds together
    budget_s: float  # aim for this much timed work per (size, algorithm)
    warmup: int  # untimed calls before each round's (1 for sizes whose model time exceeds 1 s)
    rounds: int = 2  # ours, gloo, gloo, ours, ...: a drifting background load hits both alike
    chunk_bytes: int | None = None  # our ring's pipelining chunk (None: the collectives' own default)

    def counts(self, n: int, nbytes: int, link: LinkModel) -> tuple[int, int]:
        """``(warmup, timed calls per round)`` for one size."""
        model = ring_time(n, nbytes, link)
        total = max(3, min(self.repetitions, math.floor(self.budget_s / max(model, 1e-3))))
        return (1 if model > 1.0 else self.warmup), max(2, math.ceil(total / self.rounds))


def _samples(records: list[dict[str, Any]], algorithm: str | None) -> list[float]:
    """The timed seconds of one job's metrics (ours carry ``algorithm``; gloo's do not)."""
    return [float(r["seconds"]) for r in records if r.get("algorithm") == algorithm and "seconds" in r]


def summarize(per_rank: list[list[float]], n: int, nbytes: int) -> dict[str, Any]:
    """Per rank the median of its calls; the row's time is the slowest rank's median (as gloo's ``median_s_max``)."""
    medians = [statistics.median(times) for times in per_rank]
    pooled = sorted(t for times in per_rank for t in times)
    t = max(medians)
    return {"median_s": t, "median_s_rank0": medians[0], "min_s": pooled[0],
            "p90_s": pooled[min(len(pooled) - 1, int(0.9 * len(pooled)))], "calls": len(per_rank[0]),
            "busbw": 2 * (n - 1) / n * nbytes / t}


def measure_cell(run: RunJob, n: int, profile: str, sizes: Sequence[int], *, link: LinkModel, plan: Plan,
                 ports: Iterator[int], paired: bool = False) -> list[dict[str, Any]]:
    """Every size on one shaped cluster: ours (ring, butterfly) and gloo in alternating rounds; rows.

    ``paired``: one ``allreduce_bench`` job per size times gloo too, call by call between ours.
    """
    rows = []
    for nbytes in sizes:
        warmup, reps = plan.counts(n, nbytes, link)
        model = ring_time(n, nbytes, link)
        timeout = 120.0 + 4 * (warmup + reps) * (model + 0.05)
        common = {"sizes": [nbytes], "repetitions": reps, "warmup": warmup, "timeout": max(60.0, 10 * model)}
        samples: dict[str | None, list[list[float]]] = {}
        variants: dict[str, str | None] = {}
        for k in range(1 if paired else plan.rounds):
            order = ("paired",) if paired else ("ours", "gloo") if k % 2 == 0 else ("gloo", "ours")
            for who in order:
                if who == "gloo":
                    results = run(GLOO_ALLREDUCE_JOB, {**common, "port": GLOO_PORT + next(ports) % 200}, timeout / 2)
                    names: tuple[str | None, ...] = (None,)
                else:
                    config = {**common, "port": OURS_PORT + next(ports) % 200,
                              "link": {"alpha": link.alpha, "bandwidth": link.bandwidth}}
                    if plan.chunk_bytes is not None:
                        config["chunk_bytes"] = plan.chunk_bytes
                    if paired:
                        config.update(algorithms=["ring", "butterfly", "gloo"], gloo_port=GLOO_PORT + next(ports) % 200,
                                      repetitions=reps * plan.rounds)
                    results = run("allreduce_bench", config, timeout * (1.5 if paired else 1.0))
                    variants.update({r["algorithm"]: r.get("variant") for r in results[0][0]["sizes"]})
                    names = tuple(None if a == "gloo" else a for a in variants)
                for name in names:
                    per_rank = samples.setdefault(name, [[] for _ in range(n)])
                    for rank, (_, records) in enumerate(results):
                        per_rank[rank].extend(_samples(records, name if name or not paired else "gloo"))
        gloo = summarize(samples[None], n, nbytes)
        for name, per_rank in samples.items():
            algorithm = name or "gloo"
            variant = variants.get(algorithm) if algorithm != "gloo" else None
            row = summarize(per_rank, n, nbytes)
            bound = bound_s(algorithm, variant, n, nbytes, link)
            rows.append({"workers": n, "profile": profile, "bytes": nbytes, "algorithm": algorithm,
                         "variant": variant, **row, "vs_gloo": row["median_s"] / gloo["median_s"], "bound_s": bound,
                         "vs_bound": row["median_s"] / bound, "link_share": row["busbw"] / link.bandwidth,
                         "warmup": warmup, "rounds": plan.rounds})
        logger.info("n=%d %s %s: %s", n, profile, size_label(nbytes),
                    ", ".join(f"{r['algorithm']} {1e3 * r['median_s']:.1f} ms" for r in rows[-len(samples):]))
    return rows


# -- runners ---------------------------------------------------------------------------------------


def docker_cells(workers: int, profiles: Sequence[str], sizes: Sequence[int], plan: Plan,
                 backend: str | None, *, paired: bool = False, code: Path | None = None) -> Iterator[dict[str, Any]]:
    """One cluster for ``workers``; each profile shaped in turn; yields rows.

    ``code``: a directory holding another ``protocols`` package (say, a checkout of the commit
    before a change), mounted into the containers ahead of the project's own.
    """
    ports = itertools.count()
    extra: dict[str, Any] = {}
    if code is not None:
        extra = {"mounts": (Mount(str(code.resolve()), CODE_MOUNT),),
                 "env": (("PYTHONPATH", f"{CODE_MOUNT}:{SRC_MOUNT}"),)}
    with Cluster(ClusterSpec(workers=workers, cpus=1.0, memory="1g", **extra)) as cluster:
        shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id, backend=backend)
        try:
            def run(entry: str, config: dict[str, Any], timeout: float) -> list[tuple[dict[str, Any],
                                                                                      list[dict[str, Any]]]]:
                results = cluster.run_job(entry, config, timeout=timeout)
                return [(r.value, r.metrics()) for r in results]

            for name in profiles:
                state = state_at(load_profile(name), workers, 0.0)
                shaper.apply(state)
                link = link_of(state)
                logger.info("n=%d: %s shaped by %s (alpha %.2f ms, %.0f Mbit/s)", workers, name,
                            shaper.backend, 1e3 * link.alpha, 8e-6 * link.bandwidth)
                yield from measure_cell(run, workers, name, sizes, link=link, plan=plan, ports=ports, paired=paired)
                shaper.check()
        finally:
            shaper.close()


@contextmanager
def _spec_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="bench-ar-") as tmp:
        yield Path(tmp)


def loopback_cells(workers: int, sizes: Sequence[int], plan: Plan, *, paired: bool = False) -> Iterator[dict[str, Any]]:
    """Every rank a local ``python -m squall.worker.process`` process on its own 127.0.0.x address."""
    peers = [f"127.0.0.{i + 1}" for i in range(workers)]
    jobs = itertools.count()

    def run(entry: str, config: dict[str, Any], timeout: float) -> list[tuple[dict[str, Any],
                                                                              list[dict[str, Any]]]]:
        with _spec_dir() as tmp:
            job_id = f"j{next(jobs)}"
            procs = []
            for rank in range(workers):
                spec = {"job_id": job_id, "entry": entry, "rank": rank, "world_size": workers, "peers": peers,
                        "out_dir": str(tmp / str(rank)), "config": config, "deadline_s": timeout}
                path = tmp / f"spec{rank}.json"
                path.write_text(json.dumps(spec))
                procs.append(subprocess.Popen([sys.executable, "-m", "squall.worker.process", str(path)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for proc in procs:
                proc.wait(timeout=timeout)
            values = []
            for rank in range(workers):
                out = tmp / str(rank)
                result = json.loads((out / "result.json").read_text())
                if not result["ok"]:
                    raise RuntimeError(f"{entry} failed on rank {rank}: {result['error']}")
                records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
                values.append((result["value"], records))
            return values

    yield from measure_cell(run, workers, "loopback", sizes, link=LOOPBACK, plan=plan, ports=itertools.count(),
                            paired=paired)


# -- report ----------------------------------------------------------------------------------------


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (f"{'n':>2} {'profile':<13} {'size':>5} {'algorithm':<20} {'median ms':>10} {'busbw MB/s':>10} "
            f"{'x gloo':>7} {'bound ms':>9} {'x bound':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = r["algorithm"] + (f" ({r['variant'].replace('halving_doubling', 'rab')})" if r["variant"] else "")
        lines.append(f"{r['workers']:>2} {r['profile']:<13} {size_label(r['bytes']):>5} {name:<20} "
                     f"{1e3 * r['median_s']:>10.2f} {r['busbw'] / 1e6:>10.1f} {r['vs_gloo']:>7.2f} "
                     f"{1e3 * r['bound_s']:>9.2f} {r['vs_bound']:>8.2f}")
    return "\n".join(lines)


def verdicts(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each target: met (True/False, None when no row applies) and the rows that decide it."""

    def check(name: str, chosen: list[dict[str, Any]], ok: Callable[[dict[str, Any]], bool],
              value: Callable[[dict[str, Any]], float]) -> dict[str, Any]:
        return {"met": all(ok(r) for r in chosen) if chosen else None,
                "cases": [{"workers": r["workers"], "profile": r["profile"], "bytes": r["bytes"],
                           "value": round(value(r), 3), "ok": ok(r)} for r in chosen]}

    ring_big = [r for r in rows if r["algorithm"] == "ring" and r["bytes"] >= 1 << 20 and r["profile"] != "loopback"]
    fly_small = [r for r in rows if r["algorithm"] == "butterfly" and r["profile"] == "wan-5ms"
                 and r["workers"] == 8 and (4 << 10) <= r["bytes"] <= 1 << 20]
    thin = [r for r in rows if r["algorithm"] == "ring" and r["profile"] == "thin-100mbit" and r["bytes"] == 64 << 20]
    return {
        f"ring <= {RING_VS_GLOO} x gloo (>= 1 MB)": check(
            "ring", ring_big, lambda r: r["vs_gloo"] <= RING_VS_GLOO, lambda r: r["vs_gloo"]),
        f"butterfly <= {BUTTERFLY_VS_GLOO} x gloo (4 KB..1 MB, wan-5ms, n=8)": check(
            "butterfly", fly_small, lambda r: r["vs_gloo"] <= BUTTERFLY_VS_GLOO, lambda r: r["vs_gloo"]),
        f"ring >= {THIN_LINK_SHARE:.0%} of link rate (64 MB, thin-100mbit)": check(
            "thin", thin, lambda r: r["link_share"] >= THIN_LINK_SHARE, lambda r: r["link_share"]),
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="4,8", help="comma-separated cluster sizes [4,8]")
    parser.add_argument("--sizes", default="4KB,1MB,16MB,64MB", help="comma-separated tensor sizes [4KB,1MB,16MB,64MB]")
    parser.add_argument("--profiles", default="lan,wan-5ms,thin-100mbit", help="comma-separated profiles")
    parser.add_argument("--repetitions", type=int, default=10, help="most timed calls per size and algorithm [10]")
    parser.add_argument("--budget", type=float, default=6.0, help="seconds of timed calls per size and algorithm [6]")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of ours and gloo per size [2]")
    parser.add_argument("--quick", action="store_true", help="one round, 3 timed calls after 1 warm-up, 2 s budget")
    parser.add_argument("--chunk-bytes", help="our ring's (and butterfly's) chunk, e.g. 512KB [their own rule]")
    parser.add_argument("--paired", action="store_true",
                        help="time gloo inside our job, call by call between ours, instead of in its own job")
    parser.add_argument("--loopback", action="store_true", help="local processes on 127.0.0.x, no Docker/shaping")
    parser.add_argument("--backend", choices=("netem", "nfqueue"), help="shaping backend (default: netem if any)")
    parser.add_argument("--code", type=Path, help="measure the protocols package in this directory instead "
                        "(e.g. an older checkout; it needs the jobs allreduce_bench and gloo_allreduce)")
    parser.add_argument("--json", type=Path, help="write rows, targets and verdicts here")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    chunk = None if args.chunk_bytes is None else parse_size(args.chunk_bytes)
    plan = (Plan(repetitions=3, budget_s=2.0, warmup=1, rounds=1, chunk_bytes=chunk) if args.quick
            else Plan(args.repetitions, args.budget, 2, rounds=args.rounds, chunk_bytes=chunk))
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for workers in (int(w) for w in args.workers.split(",")):
        cells = loopback_cells(workers, sizes, plan, paired=args.paired) if args.loopback else docker_cells(
            workers, profiles, sizes, plan, args.backend, paired=args.paired, code=args.code)
        for row in cells:
            rows.append(row)
    elapsed = time.monotonic() - started
    print(table(rows))
    results = verdicts(rows)
    for name, verdict in results.items():
        state = {True: "met", False: "MISSED", None: "n/a"}[verdict["met"]]
        worst = [c for c in verdict["cases"] if not c["ok"]]
        print(f"target {name}: {state}" + (f" (missed: {worst})" if worst else ""))
    print(f"total {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"commit": _commit(), "host": platform.node(), "cpus": os.cpu_count(), "elapsed_s": elapsed,
                "argv": sys.argv[1:] if argv is None else list(argv), "paired": args.paired,
                "code": None if args.code is None else str(args.code),
                "load_avg_end": os.getloadavg()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows, "verdicts": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
