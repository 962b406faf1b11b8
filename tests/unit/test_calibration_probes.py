"""The probe jobs, run in threads as three "nodes" on 127.0.0.1-3 of the loopback (no Docker)."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from squall.calibration import probes
from squall.calibration.observations import parse_tcp, parse_udp, raw_samples
from squall.job import JobContext, JobSpec, MetricsWriter
from squall.worker.registry import resolve

PEERS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _port() -> int:
    return random.Random().randrange(30000, 60000)


def _run_all(entry: Callable[[JobContext], dict[str, Any]], config: dict[str, Any], tmp: Path,
             n: int = 3) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    values: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def node(rank: int) -> None:
        out = tmp / f"n{rank}"
        out.mkdir()
        spec = JobSpec("j1", "x", rank, n, PEERS[:n], str(out), config, deadline_s=60)
        with MetricsWriter(out / "metrics.jsonl") as metrics:
            try:
                values[rank] = entry(JobContext(spec, out, metrics, time.monotonic()))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    lines = [line for r in range(n) for line in (tmp / f"n{r}" / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in lines]
    return values, records


def test_registered_names() -> None:
    assert resolve("udp_probe") is probes.udp_probe
    assert resolve("tcp_goodput") is probes.tcp_goodput
    assert resolve("tcp_rtt") is probes.tcp_rtt


def test_udp_probe_every_pair(tmp_path: Path) -> None:
    config = {"count": 200, "rate_pps": 400, "wait_s": 0.3, "port": _port(), "raw": True,
              "start_wall": time.time() + 0.5}
    values, records = _run_all(probes.udp_probe, config, tmp_path)
    pairs = [(s, d) for s in range(3) for d in range(3) if s != d]
    for rank, v in values.items():
        assert set(v["targets"]) == {str(d) for d in range(3) if d != rank}
        for t in v["targets"].values():
            assert t["sent"] == 200 and t["unsent"] == 0 and t["replies"] == 200 and t["lost"] == 0
            assert t["lost_seqs"] == []
            assert t["rtt_us"]["count"] == 200 and 0 < t["rtt_us"]["p50"] < 50_000
        assert v["late_s"] < 0 and v["stray"] == 0 and v["rx_dropped"] == {"server": 0, "client": 0}
    obs = parse_udp(values, pairs, raw_samples(records))
    assert obs.shared_clock and not obs.problems
    assert all((o.packets, o.lost) == (400, 0) for o in obs.links.values())
    assert all(len(o.one_way_samples) == 400 for o in obs.links.values())


def test_udp_probe_only_the_named_pairs(tmp_path: Path) -> None:
    config = {"pairs": [[0, 2]], "count": 50, "rate_pps": 500, "wait_s": 0.2, "port": _port(),
              "start_wall": time.time() + 0.5}
    values, _ = _run_all(probes.udp_probe, config, tmp_path)
    assert list(values[0]["targets"]) == ["2"] and values[1]["targets"] == {}
    assert values[2]["sources"] == {"0": {"received": 50, "echoed": 50, "unechoed": 0}}


def test_socket_drops_are_the_kernels_count_per_socket() -> None:
    full = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    quiet = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with full, quiet, sender:
        full.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum: a few datagrams
        full.bind(("127.0.0.1", 0))
        quiet.bind(("127.0.0.1", 0))
        for _ in range(100):
            sender.sendto(b"x" * 1000, full.getsockname())
        drops = probes.socket_drops([full, quiet])
        assert drops[quiet.fileno()] == 0
        kept = 0
        full.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while full.recv(2048):
                kept += 1
        assert drops[full.fileno()] == 100 - kept > 0
        assert probes.socket_drops([sender], table="/nonexistent") == {}


@pytest.mark.parametrize("config", [{"count": 0}, {"rate_pps": 0}, {"size": 8}, {"pairs": [[0, 0]]},
                                    {"pairs": [[0, 5]]}])
def test_udp_probe_rejects_bad_config(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        probes.UdpProbeConfig.from_config(config, 3)


def test_tcp_goodput_one_transfer_at_a_time(tmp_path: Path) -> None:
    transfers = [{"src": 0, "dst": 1, "at_s": 0.0, "seconds": 0.4, "warmup_s": 0.1},
                 {"src": 2, "dst": 0, "at_s": 0.6, "seconds": 0.4, "warmup_s": 0.1}]
    config = {"transfers": transfers, "port": _port(), "start_wall": time.time() + 0.5}
    values, _ = _run_all(probes.tcp_goodput, config, tmp_path)
    out = parse_tcp(values, [(0, 1), (2, 0)])
    for obs in out.values():
        assert obs.error is None and obs.goodput_bps is not None and obs.goodput_bps > 50e6, obs
        assert obs.mss and obs.window_s == pytest.approx(0.3, abs=0.1)
    assert values[1]["received"][0]["ended_early"] is False


def test_tcp_goodput_transfers_that_start_together_run_together(tmp_path: Path) -> None:
    transfers = [{"src": 0, "dst": d, "at_s": 0.0, "seconds": 0.6, "warmup_s": 0.1} for d in (1, 2)]
    config = {"transfers": transfers, "port": _port(), "start_wall": time.time() + 0.5}
    values, _ = _run_all(probes.tcp_goodput, config, tmp_path)
    firsts = [values[d]["received"][0]["first_wall"] for d in (1, 2)]
    assert all(values[d]["received"][0]["goodput_bps"] > 0 for d in (1, 2))
    assert abs(firsts[0] - firsts[1]) < 0.3  # one after the other, the second would start 0.6 s later


def test_tcp_goodput_reports_a_missing_sender(tmp_path: Path) -> None:
    transfers = [{"src": 0, "dst": 1, "at_s": 0.0, "seconds": 0.3, "warmup_s": 0.1}]
    config = {"transfers": transfers, "port": _port(), "start_wall": time.time() + 0.3}
    values, _ = _run_all(probes.tcp_goodput, config, tmp_path, n=2)
    values[1]["received"] = []  # as if no connection had arrived
    assert parse_tcp(values, [(0, 1)])[(0, 1)].error == "the receiver saw no transfer"
    with pytest.raises(ValueError):
        probes.Transfer.parse(0, {"src": 0, "dst": 1, "seconds": 1.0, "warmup_s": 1.0}, 2)


def test_tcp_rtt(tmp_path: Path) -> None:
    start = time.time() + 0.5
    config = {"count": 20, "interval_s": 0.002, "port": _port(), "start_wall": start, "stop_wall": start + 1.5}
    values, _ = _run_all(probes.tcp_rtt, config, tmp_path)
    for rank, v in values.items():
        assert set(v["targets"]) == {str(d) for d in range(3) if d != rank}
        assert all(t["rtt_us"]["count"] == 20 and t["connect_us"] > 0 for t in v["targets"].values())


def test_summary_statistics() -> None:
    s = probes.summary([float(v) for v in range(1, 101)])
    assert (s["count"], s["mean"], s["min"], s["max"], s["p50"], s["p90"], s["p99"]) == (100, 50.5, 1, 100, 51, 91,
                                                                                          100)
    assert probes.summary([]) == {"count": 0}
    assert probes.summary([3.0])["sd"] == 0.0
