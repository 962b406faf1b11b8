"""Start, apply, change, clear, quick calibration and teardown at 4 workers: local vs a one-node
swarm vs two Docker-in-Docker swarm nodes, side by side in one run; prints a table, writes JSON.

    flock /tmp/squall-bench.lock .venv/bin/python scripts/swarm-dind/figures.py [out.json]

The two-node case starts its nodes (images streamed in) before the clock starts: that cost is
reported on its own line (it is paid once per run of the emulation, not by a real cluster).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import ExitStack
from typing import Any

from squall.calibration.runner import calibrate
from squall.cluster import ClusterSpec
from squall.cluster.backend import open_cluster
from squall.cluster.engine import docker_client
from squall.cluster.image import current_worker_tag
from squall.cluster.swarm.agent_image import ensure_agent_image
from squall.cluster.swarm.cluster import SwarmCluster
from squall.cluster.swarm.dind import DindNodes, DindSpec
from squall.profiles import load_profile
from squall.shaping import state_at

logger = logging.getLogger("squall.figures")
WORKERS = 4


def _timed(out: dict[str, Any], key: str, call: Any) -> Any:
    t0 = time.monotonic()
    value = call()
    out[key] = round(time.monotonic() - t0, 4)
    return value


def measure(client: Any, engine: str, dind: DindNodes | None) -> dict[str, Any]:
    """One engine's figures."""
    out: dict[str, Any] = {"engine": engine if dind is None else f"{engine}, 2 DinD nodes"}
    cluster = open_cluster(ClusterSpec(workers=WORKERS, memory="512m", preload=(), engine=engine), client=client)
    if dind is not None:
        assert isinstance(cluster, SwarmCluster)
        cluster.constraints = (f"node.labels.squall.run=={dind.run_id}",)
        cluster.max_per_node = 2
    _timed(out, "start_s", cluster.start)
    try:
        where = cluster.placement()
        cross = next(((a, b) for a in where for b in where if where[a] != where[b]), (0, 1))
        inside = next((a, b) for a in where for b in where if a != b and where[a] == where[b] and (a, b) != cross)
        shaper = _timed(out, "shaper_open_s", cluster.open_shaper)
        try:
            _timed(out, "apply_s", lambda: shaper.apply(state_at(load_profile("wan-5ms"), WORKERS, 0.0)))
            _timed(out, "change_s", lambda: shaper.apply(state_at(load_profile("lossy-1pct"), WORKERS, 0.0)))
            _timed(out, "clear_s", shaper.clear)
        finally:
            shaper.close()
        report = _timed(out, "calibration_s", lambda: calibrate("wan-5ms", workers=WORKERS, cluster=cluster,
                                                                quick=True, pairs=[cross, inside]))
        out["calibration"] = "passed" if report.passed() else "not passed"
        out["delay_ms"] = {f"{r.link[0]}->{r.link[1]}": r.measured and round(r.measured, 3)
                           for r in report.rows if r.metric == "delay"}
        out["cross_node_link"] = f"{cross[0]}->{cross[1]}" if where[cross[0]] != where[cross[1]] else None
    finally:
        t_close = time.monotonic()
        cluster.close()
        out["teardown_s"] = round(time.monotonic() - t_close, 3)
    return out


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    path = sys.argv[1] if len(sys.argv) > 1 else "results/swarm-two-nodes.json"
    client = docker_client()
    worker = current_worker_tag(client)
    assert worker, "build the worker image first (make image)"
    rows = [measure(client, "local", None), measure(client, "swarm", None)]
    with ExitStack() as stack:
        nodes = DindNodes(client, DindSpec(nodes=2), images=(worker, ensure_agent_image(client)))
        t0 = time.monotonic()
        stack.enter_context(nodes)
        nodes_s = round(time.monotonic() - t0, 1)
        rows.append(measure(client, "swarm", nodes))
        rows[-1]["dind_nodes_start_s"] = nodes_s
        rows[-1]["dind_load_per_node_s"] = nodes.timings.load_per_node
    keys = ["start_s", "shaper_open_s", "apply_s", "change_s", "clear_s", "calibration_s", "teardown_s"]
    print(f"{'engine':24} " + " ".join(f"{k:>14}" for k in keys) + "  delays (ms)")
    for row in rows:
        cells = " ".join(f"{row[k]:>14}" for k in keys)
        print(f"{row['engine']:24} {cells}  {row['delay_ms']} {row['calibration']} (across: {row['cross_node_link']})")
    print(f"two DinD nodes: started with images in {rows[-1]['dind_nodes_start_s']} s "
          f"(load per node {rows[-1]['dind_load_per_node_s']})")
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
