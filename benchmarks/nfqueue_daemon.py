"""NFQUEUE daemon benchmark: sustained packets/s, CPU, and release lateness under load (root).

    .venv/bin/python benchmarks/nfqueue_daemon.py --json results/bench-nfqueue.json

Setup: namespace ``s`` (sender) joined by veth to receivers ``r0..r{N-1}``; in each receiver an
iptables rule sends ``s``'s packets to queue 1, served by one daemon with a 20 ms delay. The
daemon is pinned to the last CPU and runs SCHED_FIFO (``--realtime 0``: a normal process); the
sender is pinned to CPU 0. A paced Python UDP sender offers a ladder of loads (64-byte datagrams,
dropped by an iptables rule in INPUT after the daemon released them, so no receiving application
competes for CPU); rate 0 means "as fast as one sender can". Alongside, a 500/s UDP echo probe
measures what an application sees (one-way delay minus the configured delay).

Reported per step: offered and released packets/s, kernel queue drops, daemon CPU (user+system,
including the kernel's re-injection work done in its verdict syscalls), release lateness
p50/p99/max from the daemon (verdict time - scheduled time) and the probe's excess delay.
"Sustained" is the highest step with no kernel drops and >= 99 % of offered packets released
(also reported with p99 lateness <= 1 ms). Also: 50k/s with jitter and loss (one verdict per
packet), 16 receiver namespaces served by one daemon at 50k/s, and TCP goodput through the
delayed link behind TBF (kernel) rate limits. Targets: >= 100k packets/s sustained; p99
lateness <= 1 ms at 50k packets/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from squall.shaping.nfqueue import rules
from squall.shaping.nfqueue.config import DaemonConfig, LinkParams, NamespaceSpec, QueueSpec
from squall.shaping.nfqueue.control import ControlClient
from squall.shaping.nfqueue.launcher import DaemonProcess
from squall.shaping.testnet.echo_probe import probe
from squall.shaping.testnet.veth_pairs import Link, Testbed

BLAST_PORT = 9100
ECHO_PORT = 9000
TARGETS = {"sustained_pps": 100_000, "p99_lateness_us@50k": 1_000}


# ----------------------------------------------------------------------------- sender role


def send_role(argv: list[str]) -> int:
    """Run inside the sender namespace: offer UDP at a paced rate, print JSON counts."""
    parser = argparse.ArgumentParser(prog="nfqueue_daemon.py _send")
    parser.add_argument("--targets", required=True)
    parser.add_argument("--rate", type=float, required=True, help="packets/s, 0 = flat out")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--cpu", type=int, default=0)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.cpu})
    targets = [(t, BLAST_PORT) for t in args.targets.split(",")]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 64
    sendto, clock = sock.sendto, time.monotonic
    sent = errors = 0
    n = len(targets)
    start = clock()
    while True:
        elapsed = clock() - start
        if elapsed >= args.duration:
            break
        due = int(elapsed * args.rate) if args.rate else sent + 512
        if due <= sent:
            time.sleep(min(0.0005, (sent + 1) / args.rate - elapsed))
            continue
        while sent < due:
            try:
                sendto(payload, targets[sent % n])
            except OSError:
                errors += 1
            sent += 1
    print(json.dumps({"sent": sent, "errors": errors, "elapsed_s": clock() - start}))
    return 0


# ----------------------------------------------------------------------------- setup


def build(bed: Testbed, receivers: int) -> list[Link]:
    """Sender ``s``, receivers ``r<i>``, queue rules and a DROP for the blast port."""
    bed.add_host("s")
    links = []
    for i in range(receivers):
        key = f"r{i}"
        bed.add_host(key)
        link = bed.link("s", key)
        links.append(link)
        rules.install(bed.path(key), rules.chain_name("bench"), [rules.SourceRule(link.addr_a, 1)])
        drop = ["iptables", "-w", "-A", "INPUT", "-p", "udp", "--dport", str(BLAST_PORT), "-j", "DROP"]
        rules.run(rules.in_netns(bed.path(key), drop))
    bed.start_echo("r0", ECHO_PORT)
    return links


def daemon_for(
    bed: Testbed, receivers: int, delay_us: int, *, cpu: int, workdir: str, realtime: int
) -> DaemonProcess:
    namespaces = tuple(
        NamespaceSpec.for_named(f"r{i}", bed.hosts[f"r{i}"], [QueueSpec(1, LinkParams(delay_us=delay_us))])
        for i in range(receivers)
    )
    config = DaemonConfig(control_socket=f"{workdir}/ctl.sock", namespaces=namespaces, rcvbuf_bytes=64 << 20)
    return DaemonProcess.start(config, cpu=cpu, realtime=realtime)


def _totals(stats: dict[str, Any]) -> dict[str, float]:
    queues = stats["queues"]
    return {
        "accepted": sum(q["accepted"] for q in queues),
        "seen": sum(q["seen"] for q in queues),
        "kernel_drops": sum(
            q["kernel"].get("queue_dropped", 0) + q["kernel"].get("user_dropped", 0) for q in queues
        ),
        "cpu_s": stats["cpu_user_s"] + stats["cpu_system_s"],
    }


def settle(client: ControlClient, timeout_s: float = 10.0) -> None:
    """Wait until the previous step's backlog is gone (nothing held, nothing queued in the kernel)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queues = client.stats()["queues"]
        if all(q["held"] == 0 and q["kernel"].get("queue_total", 0) == 0 for q in queues):
            return
        time.sleep(0.1)


def step(
    bed: Testbed, daemon: DaemonProcess, links: list[Link], rate: float, *, duration: float, delay_us: int
) -> dict[str, Any]:
    """One load level: sender subprocess + probe, daemon stats before/after."""
    client = daemon.client()
    settle(client)
    client.stats(reset=True)
    before = _totals(client.stats())
    sender = bed.spawn(
        "s",
        [
            sys.executable,
            __file__,
            "_send",
            "--targets",
            ",".join(link.addr_b for link in links),
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--cpu",
            "0",
        ],
        stdout=subprocess.PIPE,
    )
    sock = bed.udp_socket("s")
    time.sleep(0.2)
    result = probe(
        sock, (links[0].addr_b, ECHO_PORT), count=int(500 * (duration - 0.5)), interval_us=2_000, wait_s=0.3
    )
    sock.close()
    out, _ = sender.communicate()
    sent = json.loads(out)
    time.sleep(max(0.05, 2 * delay_us / 1e6))
    stats = client.stats()
    after = _totals(stats)
    client.close()
    elapsed = sent["elapsed_s"]
    excess = sorted(d - delay_us for d in result.one_way_us) or [float("nan")]
    return {
        "offered_pps": round(rate) if rate else "max",
        "sent_pps": round(sent["sent"] / elapsed),
        "released_pps": round((after["accepted"] - before["accepted"]) / elapsed),
        "kernel_drops": int(after["kernel_drops"] - before["kernel_drops"]),
        "send_errors": sent["errors"],
        "daemon_cpu_pct": round(100 * (after["cpu_s"] - before["cpu_s"]) / elapsed, 1),
        "lateness_p50_us": stats["lateness"]["p50_us"],
        "lateness_p99_us": stats["lateness"]["p99_us"],
        "lateness_max_us": stats["lateness"]["max_us"],
        "probe_excess_p50_us": round(statistics.median(excess)),
        "probe_excess_p99_us": round(excess[int(0.99 * (len(excess) - 1))]),
        "probe_lost": result.lost,
    }


def tcp_goodput(bed: Testbed, link: Link, rate: str, seconds: float) -> float:
    """Mbit/s of one TCP stream s -> r0 through the delayed link, TBF ``rate`` on s's interface."""
    burst = "256kb" if rate.endswith("gbit") else "64kb"
    tc = [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        burst,
        "latency",
        "50ms",
    ]
    rules.run(rules.in_netns(bed.path("s"), tc))
    server = bed.tcp_socket("r0")
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((link.addr_b, ECHO_PORT + 2))
    server.listen(1)
    got = [0]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            while chunk := conn.recv(1 << 20):
                got[0] += len(chunk)

    thread = threading.Thread(target=sink)
    thread.start()
    client = bed.tcp_socket("s")
    client.connect((link.addr_b, ECHO_PORT + 2))
    block = b"\0" * (1 << 16)
    time.sleep(0.5)  # let slow start finish before counting
    start_bytes, start = got[0], time.monotonic()
    while time.monotonic() - start < seconds:
        client.sendall(block)
    mbit = (got[0] - start_bytes) * 8 / (time.monotonic() - start) / 1e6
    client.close()
    thread.join(10)
    server.close()
    rules.run(rules.in_netns(bed.path("s"), ["tc", "qdisc", "del", "dev", "eth0", "root"]))
    return round(mbit, 1)


# ----------------------------------------------------------------------------- report


COLUMNS = [
    ("offered_pps", "offered/s"),
    ("sent_pps", "sent/s"),
    ("released_pps", "released/s"),
    ("kernel_drops", "kdrops"),
    ("daemon_cpu_pct", "cpu%"),
    ("lateness_p50_us", "late p50"),
    ("lateness_p99_us", "late p99"),
    ("lateness_max_us", "late max"),
    ("probe_excess_p50_us", "probe+ p50"),
    ("probe_excess_p99_us", "probe+ p99"),
]


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{h:>10}" for _, h in COLUMNS))
    for row in rows:
        print("  ".join(f"{row[k]!s:>10}" for k, _ in COLUMNS))


def sustained(rows: list[dict[str, Any]], max_p99_us: float | None = None) -> int:
    """Highest released rate without kernel drops (and, if given, with p99 lateness under a bound)."""
    ok = [
        r["released_pps"]
        for r in rows
        if r["kernel_drops"] == 0
        and r["released_pps"] >= 0.99 * r["sent_pps"]
        and (max_p99_us is None or r["lateness_p99_us"] <= max_p99_us)
    ]
    return max(ok, default=0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_send":
        return send_role(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--delay-us", type=int, default=20_000)
    parser.add_argument(
        "--rates",
        default="10000,25000,50000,100000,150000,200000,0",
        help="offered packets/s per step, 0 = as fast as one sender can",
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per step")
    parser.add_argument(
        "--fanout", type=int, default=16, help="receiver namespaces of the fan-out run (0: skip)"
    )
    parser.add_argument("--fanout-rate", type=float, default=50_000)
    parser.add_argument("--no-tcp", action="store_true")
    parser.add_argument(
        "--realtime",
        type=int,
        default=10,
        help="run the daemon as SCHED_FIFO with this priority (0: normal process)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (namespaces, iptables)")
    daemon_cpu = (os.cpu_count() or 1) - 1
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "delay_us": args.delay_us,
        "duration_s": args.duration,
        "targets": TARGETS,
        "realtime": args.realtime,
    }
    with tempfile.TemporaryDirectory() as work, Testbed(prefix="squall-bench") as bed:
        links = build(bed, 1)
        with daemon_for(
            bed, 1, args.delay_us, cpu=daemon_cpu, workdir=work, realtime=args.realtime
        ) as daemon:
            rows = [
                step(bed, daemon, links, float(r), duration=args.duration, delay_us=args.delay_us)
                for r in args.rates.split(",")
            ]
            with daemon.client() as client:  # per-packet path: jitter (individual verdicts) and loss
                client.set_links([("r0", 1, LinkParams(delay_us=args.delay_us, jitter_us=5_000, loss=0.01))])
            report["jitter_loss"] = step(
                bed, daemon, links, 50_000, duration=args.duration, delay_us=args.delay_us
            )
            report["jitter_loss"]["link"] = "delay +- 5 ms uniform, 1 % loss"
            with daemon.client() as client:
                client.set_links([("r0", 1, LinkParams(delay_us=args.delay_us))])
            daemon.check()
            if not args.no_tcp:
                report["tcp_mbit"] = {
                    rate: tcp_goodput(bed, links[0], rate, 3.0) for rate in ("100mbit", "1gbit")
                }
        report["ladder"] = rows
        report["sustained_pps"] = sustained(rows)
        report["sustained_pps_p99_under_1ms"] = sustained(rows, 1_000)
        at50 = next((r for r in rows if r["offered_pps"] == 50_000), None)
        report["p99_lateness_us@50k"] = at50["lateness_p99_us"] if at50 else None
    if args.fanout:
        with tempfile.TemporaryDirectory() as work, Testbed(prefix="squall-bench") as bed:
            links = build(bed, args.fanout)
            with daemon_for(
                bed, args.fanout, args.delay_us, cpu=daemon_cpu, workdir=work, realtime=args.realtime
            ) as daemon:
                report["fanout"] = step(
                    bed, daemon, links, args.fanout_rate, duration=args.duration, delay_us=args.delay_us
                )
                report["fanout"]["namespaces"] = args.fanout
    print_table(
        f"one receiver namespace, delay {args.delay_us} us, {args.duration} s per step", report["ladder"]
    )
    print_table(
        "same at 50k/s, +- 5 ms uniform jitter and 1 % loss (one verdict per packet; probe+ includes jitter)",
        [report["jitter_loss"]],
    )
    if "fanout" in report:
        print_table(f"{args.fanout} receiver namespaces, one daemon", [report["fanout"]])
    if "tcp_mbit" in report:
        print(f"\nTCP goodput through the delayed link, TBF on the sender: {report['tcp_mbit']} Mbit/s")
    print(
        f"\nsustained: {report['sustained_pps']} packets/s without drops, "
        f"{report['sustained_pps_p99_under_1ms']} with p99 lateness <= 1 ms "
        f"(target {TARGETS['sustained_pps']}); "
        f"p99 lateness at 50k/s: {report['p99_lateness_us@50k']} us (target {TARGETS['p99_lateness_us@50k']})"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
