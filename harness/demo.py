"""``make demo`` / ``squall demo``: the default experiment.

For now: a small cluster, the all-pairs TCP echo probe over its private network, and a table of
round-trip times per directed pair. It grows into the default training experiment as the
protocols land.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time

from harness.cluster import Cluster, ClusterSpec

logger = logging.getLogger(__name__)

ROUNDS = 20


def run_demo(*, workers: int = 4, as_json: bool = False) -> int:
    """Run the demo and print its table; return the exit code."""
    t0 = time.monotonic()
    with Cluster(ClusterSpec(workers=workers, cpus=1.0, memory="1g")) as cluster:
        ready_s = time.monotonic() - t0
        results = cluster.run_job("echo_mesh", {"rounds": ROUNDS}, timeout=120)
        rtts: dict[tuple[int, int], list[float]] = {}
        failures = 0
        for res in results:
            for rec in res.metrics():
                if rec.get("ok"):
                    rtts.setdefault((res.node, rec["peer"]), []).append(rec["rtt_s"] * 1e3)
                else:
                    failures += 1
        addresses = [n.address for n in cluster.nodes]
    rows = [{"src": s, "dst": d, "exchanges": len(v), "rtt_ms_median": round(statistics.median(v), 3),
             "rtt_ms_p95": round(sorted(v)[int(0.95 * (len(v) - 1))], 3)} for (s, d), v in sorted(rtts.items())]
    if as_json:
        summary = {"workers": workers, "ready_s": ready_s, "failures": failures, "pairs": rows}
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        out = [f"Squall demo: {workers} containers ({', '.join(addresses)}), ready in {ready_s:.1f} s",
               f"TCP echo (connect + one exchange) between every ordered pair, {ROUNDS} rounds, no shaping yet:",
               "", f"{'src':>4} {'dst':>4} {'n':>4} {'median ms':>10} {'p95 ms':>8}"]
        out += [f"{r['src']:>4} {r['dst']:>4} {r['exchanges']:>4} {r['rtt_ms_median']:>10.3f} {r['rtt_ms_p95']:>8.3f}"
                for r in rows]
        out.append(f"\n{len(rows)} directed pairs, {failures} failed exchanges, total {time.monotonic() - t0:.1f} s")
        sys.stdout.write("\n".join(out) + "\n")
    return 0 if failures == 0 and len(rows) == workers * (workers - 1) else 1
