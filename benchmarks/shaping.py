"""Shaping benchmark: apply and change a full profile on 16 containers; the delay daemon at 16 nodes (root).

    .venv/bin/python benchmarks/shaping.py --json results/bench-shaping.json

Part 1, a real 16-container cluster and the nfqueue backend (this kernel has no netem):

* ``open``: :func:`open_shaper` (starts the delay daemon);
* ``apply``: the first ``apply`` of ``wan-50ms-100mbit`` (240 directed links: 16 HTB trees of
  15 classes, 240 queues bound in 16 namespaces, 16 iptables chains); target <= 1 s;
* changes, each timed ``--repeats`` times, there and back:
  ``delay`` (every link's delay and jitter: one ``set_links`` to the daemon),
  ``rate`` (another profile, ``geo-2-regions``: new delays and 240 HTB class changes),
  ``partition`` (cut the cluster in halves: 16 iptables transactions);
* ``clear`` and ``close``; and a sanity check that the links are shaped (``echo_mesh`` between
  nodes 0 and 15: two round trips of 2 x 50 ms each, about 200 ms give or take the 2 ms jitter).

Part 2, the delay daemon at 16 nodes, all 240 directed links at 20 ms, in plain namespaces on a
bridge (:class:`squall.shaping.testnet.bridged_lan.BridgedLan`): senders in 4 hosts offer 64-byte UDP to all 15
others (the paced sender of ``benchmarks/nfqueue_daemon.py``), receivers drop it after the daemon
released it; a 500/s echo probe between two other hosts measures the one-way delay. Reported per
load: released packets/s, kernel drops, daemon CPU, release lateness p50/p99/max, probe excess.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import nfqueue_daemon  # the paced sender and settle() of the daemon benchmark (same directory)

from squall.cluster import Cluster, ClusterSpec
from squall.profiles import LinkSpec, load_profile
from squall.shaping import LinkState, open_shaper, state_at
from squall.shaping.nfqueue.backend import NfqueueShaper
from squall.shaping.planning.state import partition_pairs
from squall.shaping.testnet.bridged_lan import BridgedLan

TARGETS = {"apply_s@16": 1.0, "change_s@16": 0.1}
ECHO_PORT = 9000


def timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def summary(samples: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(samples) * 1e3, 1), "max_ms": round(max(samples) * 1e3, 1),
            "n": len(samples)}


# ----------------------------------------------------------------------------- part 1: a cluster


def shifted(state: LinkState, delay_us: int) -> LinkState:
    """The same state with every link's delay moved by ``delay_us``."""
    links = {pair: dataclasses.replace(spec, delay_us=spec.delay_us + delay_us) for pair, spec in state.links.items()}
    return dataclasses.replace(state, links=links)


def cluster_part(workers: int, repeats: int) -> dict[str, Any]:
    spec = ClusterSpec(workers=workers, cpus=1.0, memory="512m", preload=())
    t0 = time.monotonic()
    with Cluster(spec) as cluster:
        ready_s = time.monotonic() - t0
        wan = state_at(load_profile("wan-50ms-100mbit"), workers, 0.0)
        geo = state_at(load_profile("geo-2-regions"), workers, 0.0)
        halves = dataclasses.replace(wan, blocked=partition_pairs([range(workers // 2), range(workers // 2, workers)]))
        t0 = time.perf_counter()
        shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id, backend="nfqueue")
        open_s = time.perf_counter() - t0
        try:
            apply_s = timed(lambda: shaper.apply(wan))
            away = {"delay": shifted(wan, 10_000), "rate": geo, "partition": halves}
            changes: dict[str, list[float]] = {kind: [] for kind in away}
            for _ in range(repeats):
                for kind, other in away.items():
                    changes[kind] += [timed(partial(shaper.apply, other)), timed(partial(shaper.apply, wan))]
            shaper.check()
            results = cluster.run_job("echo_mesh", {"participants": [0, workers - 1]}, nodes=[0, workers - 1],
                                      timeout=60)
            rtts = [r["rtt_s"] for res in results for r in res.metrics() if r.get("ok")]
            clear_s = timed(shaper.clear)
        finally:
            close_s = timed(shaper.close)
    links = len(wan.links)
    return {
        "workers": workers,
        "links": links,
        "cluster_ready_s": round(ready_s, 1),
        "open_ms": round(open_s * 1e3, 1),
        "apply_ms": round(apply_s * 1e3, 1),
        "change": {kind: summary(samples) for kind, samples in changes.items()},
        "clear_ms": round(clear_s * 1e3, 1),
        "close_ms": round(close_s * 1e3, 1),
        "echo_rtt_ms": [round(r * 1e3, 1) for r in rtts],
    }


# ----------------------------------------------------------------------------- part 2: the daemon


def daemon_part(hosts: int, delay_us: int, rates: list[float], duration: float, senders: int) -> list[dict[str, Any]]:
    rows = []
    with BridgedLan(hosts, prefix="squall-bench") as lan:
        drop = ["iptables", "-w", "-A", "INPUT", "-p", "udp", "--dport", str(nfqueue_daemon.BLAST_PORT), "-j", "DROP"]
        for i in range(hosts):
            lan.run(i, drop)
        probe_src, probe_dst = hosts - 2, hosts - 1
        lan.start_echo(probe_dst, ECHO_PORT)
        state = LinkState({(s, d): LinkSpec(delay_us=delay_us) for s in range(hosts) for d in range(hosts) if s != d})
        shaper = open_shaper(lan.endpoints, run_id="bench", backend="nfqueue")
        try:
            assert isinstance(shaper, NfqueueShaper)
            apply_s = timed(lambda: shaper.apply(state))
            for rate in rates:
                row = load_step(lan, shaper, rate, duration=duration, senders=senders,
                                probe_pair=(probe_src, probe_dst), delay_us=delay_us)
                row["apply_ms"] = round(apply_s * 1e3, 1)
                rows.append(row)
            shaper.check()
        finally:
            shaper.close()
    return rows


def load_step(lan: BridgedLan, shaper: NfqueueShaper, rate: float, *, duration: float, senders: int,
              probe_pair: tuple[int, int], delay_us: int) -> dict[str, Any]:
    client = shaper.daemon.client()
    nfqueue_daemon.settle(client)
    client.stats(reset=True)
    before = nfqueue_daemon._totals(client.stats())
    procs = []
    for s in range(senders):
        targets = ",".join(ep.address for ep in lan.endpoints if ep.index != s)
        argv = [sys.executable, nfqueue_daemon.__file__, "_send", "--targets", targets, "--rate", str(rate / senders),
                "--duration", str(duration), "--cpu", "0"]
        procs.append(lan.bed.spawn(lan.key(s), argv, stdout=subprocess.PIPE))
    time.sleep(0.2)
    result = lan.probe(*probe_pair, ECHO_PORT, count=int(500 * (duration - 0.5)), interval_us=2_000, wait_s=0.3)
    sent = [json.loads(p.communicate()[0]) for p in procs]
    time.sleep(2 * delay_us / 1e6 + 0.05)
    stats = client.stats()
    after = nfqueue_daemon._totals(stats)
    client.close()
    elapsed = max(s["elapsed_s"] for s in sent)
    excess = sorted(d - delay_us for d in result.one_way_us) or [float("nan")]
    return {
        "offered_pps": round(rate),
        "sent_pps": round(sum(s["sent"] for s in sent) / elapsed),
        "released_pps": round((after["accepted"] - before["accepted"]) / elapsed),
        "kernel_drops": int(after["kernel_drops"] - before["kernel_drops"]),
        "daemon_cpu_pct": round(100 * (after["cpu_s"] - before["cpu_s"]) / elapsed, 1),
        "lateness_p50_us": stats["lateness"]["p50_us"],
        "lateness_p99_us": stats["lateness"]["p99_us"],
        "lateness_max_us": stats["lateness"]["max_us"],
        "probe_excess_p50_us": round(statistics.median(excess)),
        "probe_excess_p99_us": round(excess[int(0.99 * (len(excess) - 1))]),
        "probe_lost": result.lost,
    }


# ----------------------------------------------------------------------------- report


def print_report(report: dict[str, Any]) -> None:
    c = report.get("cluster")
    if c:
        print(f"\n{c['workers']} containers, {c['links']} directed links, nfqueue backend "
              f"(cluster ready in {c['cluster_ready_s']} s)")
        print(f"  open_shaper {c['open_ms']} ms   first apply {c['apply_ms']} ms (target <= "
              f"{TARGETS['apply_s@16'] * 1e3:.0f} ms)   clear {c['clear_ms']} ms   close {c['close_ms']} ms")
        print(f"  {'change':>10} {'median ms':>10} {'max ms':>8} {'n':>4}")
        for kind, s in c["change"].items():
            print(f"  {kind:>10} {s['median_ms']:>10} {s['max_ms']:>8} {s['n']:>4}")
        print(f"  echo_mesh 0 <-> {c['workers'] - 1} under wan-50ms-100mbit: RTTs {c['echo_rtt_ms']} ms "
              "(about 200 expected: 2 round trips of 2 x 50 ms, plus or minus jitter)")
    rows = report.get("daemon")
    if rows:
        d = report["daemon_setup"]
        print(f"\ndelay daemon: {d['hosts']} namespaces, all {d['links']} links at {d['delay_us']} us, "
              f"{d['senders']} senders (first apply {rows[0]['apply_ms']} ms)")
        cols = ["offered_pps", "sent_pps", "released_pps", "kernel_drops", "daemon_cpu_pct", "lateness_p50_us",
                "lateness_p99_us", "lateness_max_us", "probe_excess_p50_us", "probe_excess_p99_us", "probe_lost"]
        heads = ["offered/s", "sent/s", "released/s", "kdrops", "cpu%", "late p50", "late p99", "late max",
                 "probe+ p50", "probe+ p99", "lost"]
        print("  ".join(f"{h:>10}" for h in heads))
        for row in rows:
            print("  ".join(f"{row[k]!s:>10}" for k in cols))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="times each change is made (there and back)")
    parser.add_argument("--delay-us", type=int, default=20_000)
    parser.add_argument("--rates", default="10000,25000,50000", help="offered packets/s of the daemon part")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per load step")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--no-daemon", action="store_true")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (namespaces, tc, iptables)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "targets": TARGETS,
    }
    if not args.no_cluster:
        report["cluster"] = cluster_part(args.workers, args.repeats)
        report["apply_within_target"] = report["cluster"]["apply_ms"] <= TARGETS["apply_s@16"] * 1e3
    if not args.no_daemon:
        hosts = args.workers
        report["daemon_setup"] = {"hosts": hosts, "links": hosts * (hosts - 1), "delay_us": args.delay_us,
                                  "senders": args.senders, "duration_s": args.duration}
        rates = [float(r) for r in args.rates.split(",")]
        report["daemon"] = daemon_part(hosts, args.delay_us, rates, args.duration, args.senders)
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
