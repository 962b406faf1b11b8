"""Compression benchmark: each compressed all-reduce against our dense ring and gloo, on the same shaped containers.

    .venv/bin/python benchmarks/compression.py --workers 4 --sizes 1MB,4MB --profiles thin-20mbit,thin-100mbit \\
        --json results/bench-compression.json
    .venv/bin/python benchmarks/compression.py --loopback --workers 4 --sizes 1MB    # no Docker

For each worker count one cluster is started; for each profile its links are shaped, then the job
``squall.bench.compressed:compressed_bench`` times, size by size and call by call, ``squall.collectives.allreduce``
with each compressor (that module's table): the dense ring (float32, and float16: ``dense16``, T8.2's yardstick),
Top-K by all-gather, Rand-K and ARC-Top-K by index-free ring, and group quantization in INT8/INT4 by the
two-step and the per-hop ring schedules, and the job
``gloo_allreduce`` times ``torch.distributed``'s gloo on the same containers. Sizes are binary float32
tensors per rank (the fp16 ring all-reduces the same values in half the bytes).

Per row: the slowest rank's median time, the ratio to the dense ring's, the fp16 ring's and gloo's, the bytes one
rank sent per call as counted by its transport (and that over the dense ring's), and the alpha-beta
lower bound from the compressed byte count: ``hops alpha + bytes / (links B)`` (``hops`` the algorithm's
sequential one-way latencies, alpha the profile's delay, B its rate per link, ``links`` the links a
rank's bytes leave on side by side: ``n - 1`` for all-gather and all-to-all, 1 for a ring); ``x bound``
well below 1 would mean the measurement or the model is wrong (the emulated delay and rate are good to
a few per cent: rows below 0.95 are listed). Where the fp16 ring ran beside the two-step all-reduces, a
line per cell gives the low-bit speed claim's verdict (T8.2 of docs/protocols/lowbit.md: INT8 <= 0.6x,
INT4 <= 0.4x the fp16 ring, neither below its bound).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allreduce import LOOPBACK, link_of, parse_size, size_label

from squall.bench.compressed import ALGORITHMS, CompressedBenchConfig
from squall.cluster import Cluster, ClusterSpec
from squall.collectives.cost import LinkModel, ring_time
from squall.profiles import load_profile
from squall.protocols.baselines.protocol import ALLREDUCE_JOB as GLOO_ALLREDUCE_JOB
from squall.shaping import open_shaper, state_at

logger = logging.getLogger("bench.compression")

ENTRY = "squall.bench.compressed:compressed_bench"
PORT = 29630
GLOO_PORT = 29530
BOUND_SLACK = 0.95  # the emulated links' delay and rate are good to a few per cent

#: Runs one job on every node: each rank's (value, metrics records).
RunJob = Callable[[str, dict[str, Any], float], list[tuple[dict[str, Any], list[dict[str, Any]]]]]


def measure(run: RunJob, n: int, profile: str, sizes: Sequence[int], *, link: LinkModel, algorithms: Sequence[str],
            repetitions: int, ports: Iterator[int], gloo: bool = True,
            settings: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every size and algorithm on one shaped cluster; rows. ``settings``: the compressors' (ratio, arc_ratio, ...)."""
    timeout = 120.0 + 3 * (repetitions + 1) * len(algorithms) * sum(ring_time(n, s, link) + 0.5 for s in sizes)
    config = {"sizes": list(sizes), "algorithms": list(algorithms), "repetitions": repetitions, "warmup": 1,
              "port": PORT + next(ports) % 100, "timeout": max(60.0, 20 * ring_time(n, max(sizes), link)),
              **(settings or {})}
    results = run(ENTRY, config, timeout)
    gloo_rows: dict[int, float] = {}
    if gloo:
        cfg = {"sizes": list(sizes), "repetitions": repetitions, "port": GLOO_PORT + next(ports) % 100,
               "timeout": config["timeout"]}
        for row in run(GLOO_ALLREDUCE_JOB, cfg, timeout)[0][0]["sizes"]:
            gloo_rows[int(row["bytes"])] = float(row.get("median_s_max", row["median_s"]))
    rows = []
    for size in sizes:
        mine = {r["algorithm"]: r for r in results[0][0]["rows"] if r["bytes"] == size}
        sent = {a: max(next(r for r in value["rows"] if r["bytes"] == size and r["algorithm"] == a)["bytes_sent"]
                       for value, _ in results) for a in mine}
        dense, dense16 = mine.get("dense"), mine.get("dense16")
        for algorithm, r in mine.items():
            t = float(r["median_s_max"])
            bound = r["hops"] * link.alpha + sent[algorithm] / (r["links"] * link.bandwidth)
            rows.append({
                "workers": n, "profile": profile, "bytes": size, "algorithm": algorithm, "median_s": t,
                "vs_dense": t / float(dense["median_s_max"]) if dense else None,
                "vs_fp16": t / float(dense16["median_s_max"]) if dense16 else None,
                "vs_gloo": t / gloo_rows[size] if size in gloo_rows else None,
                "gloo_s": gloo_rows.get(size), "bytes_sent": sent[algorithm],
                "bytes_vs_dense": sent[algorithm] / sent["dense"] if "dense" in sent else None,
                "hops": r["hops"], "bound_s": bound, "vs_bound": t / bound,
            })
        logger.info("n=%d %s %s: %s", n, profile, size_label(size),
                    ", ".join(f"{r['algorithm']} {1e3 * r['median_s']:.1f} ms" for r in rows[-len(mine):]))
    return rows


def docker_rows(workers: int, profiles: Sequence[str], sizes: Sequence[int], algorithms: Sequence[str],
                *, repetitions: int, backend: str | None,
                settings: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """One cluster of ``workers``; each profile shaped in turn."""
    ports = itertools.count()
    with Cluster(ClusterSpec(workers=workers, cpus=1.0, memory="1g")) as cluster:
        shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id, backend=backend)
        try:
            def run(entry: str, config: dict[str, Any], timeout: float) -> list[tuple[dict[str, Any],
                                                                                      list[dict[str, Any]]]]:
                return [(r.value, r.metrics()) for r in cluster.run_job(entry, config, timeout=timeout)]

            for name in profiles:
                state = state_at(load_profile(name), workers, 0.0)
                shaper.apply(state)
                link = link_of(state)
                yield from measure(run, workers, name, sizes, link=link, algorithms=algorithms,
                                   repetitions=repetitions, ports=ports, settings=settings)
                shaper.check()
        finally:
            shaper.close()


def loopback_rows(workers: int, sizes: Sequence[int], algorithms: Sequence[str],
                  repetitions: int, settings: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every rank a local ``python -m squall.worker.process`` on 127.0.0.x (no gloo, no shaping)."""
    peers = [f"127.0.0.{i + 1}" for i in range(workers)]

    def run(entry: str, config: dict[str, Any], timeout: float) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        with tempfile.TemporaryDirectory(prefix="bench-cmp-") as name:
            tmp = Path(name)
            procs = []
            for rank in range(workers):
                spec = {"job_id": "j", "entry": entry, "rank": rank, "world_size": workers, "peers": peers,
                        "out_dir": str(tmp / str(rank)), "config": config, "deadline_s": timeout}
                (tmp / f"spec{rank}.json").write_text(json.dumps(spec))
                spec_path = str(tmp / f"spec{rank}.json")
                procs.append(subprocess.Popen([sys.executable, "-m", "squall.worker.process", spec_path],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for proc in procs:
                proc.wait(timeout=timeout)
            out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
            for rank in range(workers):
                result = json.loads((tmp / str(rank) / "result.json").read_text())
                if not result["ok"]:
                    raise RuntimeError(f"{entry} failed on rank {rank}: {result['error']}")
                out.append((result["value"], []))
            return out

    yield from measure(run, workers, "loopback", sizes, link=LOOPBACK, algorithms=algorithms,
                       repetitions=repetitions, ports=itertools.count(), gloo=False, settings=settings)


def _ratio(value: float | None) -> str:
    return f"{value:>7.2f}" if value is not None else f"{'-':>7}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a fixed-width table."""
    head = (f"{'n':>2} {'profile':<13} {'size':>5} {'algorithm':<9} {'median ms':>10} {'x dense':>7} {'x fp16':>7} "
            f"{'x gloo':>7} "
            f"{'KB sent':>9} {'x bytes':>7} {'bound ms':>9} {'x bound':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['workers']:>2} {r['profile']:<13} {size_label(r['bytes']):>5} {r['algorithm']:<9} "
                     f"{1e3 * r['median_s']:>10.1f} {_ratio(r['vs_dense'])} {_ratio(r.get('vs_fp16'))} "
                     f"{_ratio(r['vs_gloo'])} "
                     f"{r['bytes_sent'] / 1024:>9.1f} {_ratio(r['bytes_vs_dense'])} {1e3 * r['bound_s']:>9.1f} "
                     f"{r['vs_bound']:>7.2f}")
    return "\n".join(lines)


#: T8.2 (docs/protocols/lowbit.md): the two-step all-reduce's time over the fp16 ring's, at most.
T82_LIMITS = {"int8": 0.6, "int4": 0.4}


def t82_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """T8.2's verdict for every cell that ran the fp16 ring beside the two-step all-reduces."""
    lines = []
    for r in rows:
        limit = T82_LIMITS.get(r["algorithm"])
        if limit is None or r.get("vs_fp16") is None:
            continue
        verdict = "met" if r["vs_fp16"] <= limit and r["vs_bound"] >= BOUND_SLACK else "MISSED"
        lines.append(f"T8.2 {r['profile']} {size_label(r['bytes'])} n={r['workers']}: {r['algorithm']} "
                     f"{r['vs_fp16']:.2f}x the fp16 ring (<= {limit}), {r['vs_bound']:.2f}x its bound: {verdict}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="4", help="comma-separated cluster sizes [4]")
    parser.add_argument("--sizes", default="1MB,4MB", help="comma-separated float32 sizes per rank [1MB,4MB]")
    parser.add_argument("--profiles", default="thin-20mbit,thin-100mbit", help="comma-separated profiles")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help=f"subset of {','.join(ALGORITHMS)}")
    parser.add_argument("--repetitions", type=int, default=5, help="timed calls per size and algorithm [5]")
    parser.add_argument("--ratio", type=float, default=0.01, help="Top-K and Rand-K fraction of coordinates [0.01]")
    parser.add_argument("--arc-ratio", type=float, default=0.05, help="ARC-Top-K fraction of rows [0.05]")
    parser.add_argument("--arc-rank", type=int, default=4, help="ARC-Top-K sketch rank [4]")
    parser.add_argument("--arc-cols", type=int, default=256, help="columns of ARC-Top-K's matrix view [256]")
    parser.add_argument("--loopback", action="store_true", help="local processes on 127.0.0.x, no Docker/shaping")
    parser.add_argument("--backend", choices=("netem", "nfqueue"), help="shaping backend (default: netem if any)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = sorted(set(algorithms) - set(ALGORITHMS))
    if unknown:
        parser.error(f"--algorithms: unknown {unknown}; allowed: {','.join(ALGORITHMS)}")
    if "dense" not in algorithms:
        algorithms.insert(0, "dense")  # every ratio is against it
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    settings = {"ratio": args.ratio, "arc_ratio": args.arc_ratio, "arc_rank": args.arc_rank, "arc_cols": args.arc_cols}
    try:
        CompressedBenchConfig.from_json(settings)  # a bad value is refused here, naming the option, not in a worker
    except ValueError as exc:
        parser.error(f"--{str(exc).replace('_', '-')}")  # "--arc-ratio = 0.0 must be in (0, 1]"
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for workers in (int(w) for w in args.workers.split(",")):
        cells = (loopback_rows(workers, sizes, algorithms, args.repetitions, settings) if args.loopback
                 else docker_rows(workers, profiles, sizes, algorithms, repetitions=args.repetitions,
                                  backend=args.backend, settings=settings))
        rows.extend(cells)
    elapsed = time.monotonic() - started
    print(table(rows))
    below = [f"{r['profile']} {size_label(r['bytes'])} {r['algorithm']} x{r['vs_bound']:.2f}" for r in rows
             if r["vs_bound"] < BOUND_SLACK]
    print(f"{len(below)} rows below {BOUND_SLACK} x their alpha-beta bound" + (f": {below}" if below else ""))
    for line in t82_lines(rows):
        print(line)
    print(f"total {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"host": platform.node(), "cpus": os.cpu_count(), "elapsed_s": elapsed, "argv": sys.argv[1:],
                "load_avg_end": os.getloadavg(), "median_vs_dense": {
                    a: statistics.median(r["vs_dense"] for r in rows if r["algorithm"] == a and r["vs_dense"])
                    for a in algorithms}}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
