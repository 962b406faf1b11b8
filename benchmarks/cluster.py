"""Cluster benchmark: time to ready, job dispatch overhead, teardown time, idle container memory.

    .venv/bin/python benchmarks/cluster.py --workers 4,8,16 --json results/bench-cluster.json

Targets on a 2-core machine with the image built (issue 43): 16 workers ready <= 10 s and 4 <= 4 s,
dispatch overhead no worse than 0.27 s per job, an idle container no larger than 150 MB. "Ready" is
every agent answering with its preloads imported (torch and the protocols' code: a job is then a
fork); ``first job`` is from the start to the end of the first empty job, what a run waits for.
Memory is the container's cgroup usage without page
cache (v1: ``rss``; v2: ``anon``), i.e. what one more idle worker costs; shared library pages of
the image are counted in the page cache, shared by all containers, and not included. Agents are
forks of the run's fork server (:mod:`squall.cluster.forkserve`): the pages they share with it are
counted once, in the fork server's container, which is its own column (and in the total).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from squall.cluster import Cluster, ClusterSpec

TARGETS = {"ready_s@16": 10.0, "ready_s@4": 4.0, "dispatch_s": 0.27, "idle_mb": 150.0}


def measure(workers: int, dispatches: int, *, fork: bool = True) -> dict[str, Any]:
    t0 = time.monotonic()
    cluster = Cluster(ClusterSpec(workers=workers, cpus=1.0, memory="1g", fork_agents=fork)).start()
    ready = time.monotonic() - t0
    try:
        cluster.run_job("noop")  # warm-up
        first_job = time.monotonic() - t0
        times = []
        for _ in range(dispatches):
            t = time.monotonic()
            cluster.run_job("noop")
            times.append(time.monotonic() - t)
        time.sleep(1.0)
        mems = [cluster.memory_mb(n.index) for n in cluster.nodes]
        server = cluster.fork_server
        server_mb = (_container_mb(cluster.client, server.container_id)
                     if server is not None and server.container_id is not None else 0.0)
    finally:
        t = time.monotonic()
        cluster.close()
        teardown = time.monotonic() - t
    return {"workers": workers, "agents": "forked" if fork else "own imports", "ready_s": ready,
            "first_job_s": first_job,
            "dispatch_s_median": statistics.median(times),
            "dispatch_s_max": max(times), "teardown_s": teardown, "idle_mb_median": statistics.median(mems),
            "idle_mb_max": max(mems), "fork_server_mb": server_mb,
            "total_idle_mb": sum(mems) + server_mb}


def _container_mb(client: Any, container_id: str) -> float:
    """A container's memory without page cache, as Cluster.memory_mb reads a worker's."""
    stats = client.api.stats(container_id, stream=False)["memory_stats"].get("stats", {})
    return float(stats.get("total_rss", stats.get("rss", stats.get("anon", 0)))) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="4,8,16", help="comma-separated cluster sizes")
    parser.add_argument("--dispatches", type=int, default=10, help="empty jobs timed per size")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--side-by-side", action="store_true",
                        help="also run each size with agents that import their own modules (no fork server)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    modes = (True, False) if args.side_by_side else (True,)
    all_rows = [measure(int(n), args.dispatches, fork=fork) for n in args.workers.split(",") for fork in modes]
    header = (f"{'workers':>7} {'agents':>11} {'ready s':>8} {'first job s':>11} {'dispatch s (med/max)':>21} "
              f"{'teardown s':>10} "
              f"{'idle MB (med/max)':>18} {'fork server MB':>14} {'all idle MB':>11}")
    print(header)
    for r in all_rows:
        print(f"{r['workers']:>7} {r['agents']:>11} {r['ready_s']:>8.2f} {r['first_job_s']:>11.2f} "
              f"{r['dispatch_s_median']:>10.3f} / {r['dispatch_s_max']:<8.3f} "
              f"{r['teardown_s']:>10.2f} {r['idle_mb_median']:>8.1f} / {r['idle_mb_max']:<7.1f} "
              f"{r['fork_server_mb']:>14.1f} {r['total_idle_mb']:>11.1f}")
    rows = [r for r in all_rows if r["agents"] == "forked"]  # the targets are for the default
    verdicts = {
        "ready_16_le_10s": next((r["ready_s"] <= TARGETS["ready_s@16"] for r in rows if r["workers"] == 16), None),
        "ready_4_le_4s": next((r["ready_s"] <= TARGETS["ready_s@4"] for r in rows if r["workers"] == 4), None),
        "dispatch_le_0.27s": all(r["dispatch_s_median"] <= TARGETS["dispatch_s"] for r in rows),
        "idle_le_150mb": all(r["idle_mb_max"] <= TARGETS["idle_mb"] for r in rows),
    }
    print("targets:", ", ".join(f"{k}={'met' if v else 'MISSED' if v is not None else 'n/a'}"
                                 for k, v in verdicts.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": all_rows, "targets": TARGETS, "verdicts": verdicts}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
