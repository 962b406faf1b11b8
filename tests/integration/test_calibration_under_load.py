"""Calibration measures the link, not the scheduler: two CPU-bound processes beside it change no verdict.

One 4-container cluster calibrates ``wan-5ms`` (5 ms each way, 1 Gbit/s) on two directed links
twice, first with nothing added, then with two busy-loop processes (one per core of the 2-core
machines this runs on) started and reaped by the test. Every check of the busy run must end as it
ended on the quiet one, or ``unknown`` with the reason the host was too busy: a probe that the
burners could keep off the CPU would read their time slices as delay and jitter and fail. The
burners must really have run (their CPU time is read from ``/proc``), or the test proves nothing.

The UDP probes run as real-time processes in the containers' namespaces
(:mod:`squall.calibration.hostprobe`), which is what keeps the busy verdicts; the test holds the
machine's benchmark lock, so its burners spoil no other helper's timing and theirs none of its.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from squall.calibration import hostprobe
from squall.calibration.observations import parse_udp
from squall.calibration.report import CalibrationReport
from squall.calibration.runner import calibrate, calibration_spec
from squall.calibration.stalls import TOO_BUSY
from squall.checks.verdict import Validity
from squall.cluster import Cluster
from squall.shaping.testnet.bridged_lan import BridgedLan
from tests.timing import CpuBurners, bench_lock

logger = logging.getLogger(__name__)

PROFILE = "wan-5ms"
WORKERS = 4
PAIRS = [(0, 1), (1, 0)]
BURNERS = 2
MIN_BURNER_SHARE = 0.2  # CPU s the burners got per s of the busy run (2.0 at most; other work shares the CPU)


def test_host_probes_run_real_time_inside_the_nodes_namespaces() -> None:
    """The host's probe processes (no Docker: two plain namespaces on a bridge) run as SCHED_FIFO,
    probe from the nodes' own addresses (bound inside their namespaces), and leave no process or file."""
    if hostprobe.unavailable([]) is not None:
        pytest.skip(f"host probes unavailable: {hostprobe.unavailable([])}")
    with BridgedLan(2, prefix="sqhp") as lan:
        assert hostprobe.unavailable(lan.endpoints) is None
        config = {"pairs": [[0, 1], [1, 0]], "count": 300, "rate_pps": 200.0, "wait_s": 0.3, "raw": True}
        start = time.time() + 1.0
        handle = hostprobe.start(lan.endpoints, "udp_probe", config, start_wall=start, timeout_s=20.0)
        time.sleep(max(0.0, start - time.time()))  # the probes run for 1.5 s from here
        policies = [os.sched_getscheduler(p.pid) for p in handle.procs]
        results = handle.wait()
    assert policies == [os.SCHED_FIFO, os.SCHED_FIFO]
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert not handle.root.exists(), "the probe's directory was left behind"
    assert all(p.poll() is not None for p in handle.procs)
    obs = parse_udp({r.node: r.value for r in results}, [(0, 1), (1, 0)], None)
    assert obs.shared_clock and not obs.problems, obs.problems
    for link in ((0, 1), (1, 0)):
        trip = obs.round_trips[link]
        assert trip.sent == trip.replies == 300, trip


@pytest.fixture(scope="module")
def cluster(docker_client: Any, worker_image: str) -> Iterator[Cluster]:
    """Name: cluster. Scope: module. Depends: docker_client, worker_image. Four workers without torch."""
    with Cluster(calibration_spec(WORKERS), client=docker_client) as c:
        yield c


def _calibrate(cluster: Cluster) -> CalibrationReport:
    report = calibrate(PROFILE, workers=WORKERS, pairs=PAIRS, quick=True, cluster=cluster)
    logger.info("%s", report.format())
    assert not report.errors, report.format()
    return report


def _busy_reason(row: Any) -> bool:
    return row.validity is Validity.UNKNOWN and TOO_BUSY in row.why


@pytest.mark.docker
@pytest.mark.slow
def test_two_cpu_burners_change_no_verdict(cluster: Cluster) -> None:
    with bench_lock():
        quiet = _calibrate(cluster)
        with CpuBurners(BURNERS) as burners:
            t0 = time.monotonic()
            busy = _calibrate(cluster)
            span = time.monotonic() - t0
            burned = burners.cpu_s()
    assert burned >= MIN_BURNER_SHARE * span, (
        f"the burners used {burned:.1f} CPU s in {span:.1f} s: the busy run was not busy")
    # A correct backend on a quiet host: nothing fails (a row the host was too busy for may be unknown)
    failed = [r for r in quiet.rows if r.validity is Validity.FAIL]
    assert not failed, "quiet run:\n" + quiet.format()
    before = {(r.link, r.metric): r for r in quiet.rows}
    after = {(r.link, r.metric): r for r in busy.rows}
    assert before.keys() == after.keys()
    changed = []
    for key, was in before.items():
        now = after[key]
        if _busy_reason(was):  # the quiet run could not judge it: the busy one must not fail it either
            moved = now.validity is Validity.FAIL
        else:  # the same verdict, or unknown because the host was too busy
            moved = now.verdict != was.verdict and not _busy_reason(now)
        if moved:
            changed.append(f"{key[0][0]}->{key[0][1]} {key[1]}: {was.verdict} quiet, {now.verdict} busy ({now.why})")
    assert not changed, "verdicts moved by two CPU burners:\n" + "\n".join(changed) + "\n\n" + busy.format()
    unknown = [r for r in busy.rows if _busy_reason(r)]
    logger.info("busy run: burners used %.1f CPU s in %.1f s; %d of %d checks unknown (host too busy)",
                burned, span, len(unknown), len(busy.rows))
    if len(unknown) == len(busy.rows):
        pytest.skip("the host was too busy to judge any check beside the burners (nothing moved, nothing judged):\n"
                    + busy.format())
