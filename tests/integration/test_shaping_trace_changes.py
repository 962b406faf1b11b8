"""A traced profile on real containers: its changes are applied in place, and TCP survives them.

One TCP stream runs from node 0 to node 1 while a trace changes that link's delay and rate 50 times
(every 100 ms) through the run's instrument: every change planned ahead and sent by the real-time
executor (the nfqueue delay daemon here; the netem VM runs the same test for netem,
``tests/netem_vm/``). In place means the kernel objects are never deleted and re-added: the
stream never resets, and the byte counter of the link's HTB class, read all along, never goes back
(a class deleted and added again would start from 0).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.calibration.plan import TransferPlan
from squall.calibration.probing import LEAD_S, run_tcp
from squall.calibration.runner import calibration_spec
from squall.cluster import Cluster
from squall.profiles import Profile, load_profile
from squall.shaping import Shaper, link_timeline, netem_probe, open_shaper
from squall.shaping.base import SchedulingShaper
from squall.shaping.planning.ops import peer_minor

pytestmark = [pytest.mark.docker, pytest.mark.slow]

N = 2
CHANGES = 50
STEP_S = 0.1
STREAM_S = 7.0  # the stream outlasts the changes (they start 0.5 s into it and take 5 s)


def _backends() -> list[Any]:
    probe = netem_probe()
    return [pytest.param("netem", marks=pytest.mark.skipif(not probe.available, reason=probe.reason)), "nfqueue"]


def trace_profile(folder: Path) -> Profile:
    """Delay 5/20 ms and rate 20/50 Mbit/s alternating every 100 ms on every link, 51 rows."""
    rows = [f"{i * STEP_S:.1f}s,{(5, 20)[i % 2]}ms,{(20, 50)[i % 2]}mbit" for i in range(CHANGES + 1)]
    (folder / "flip.csv").write_text("time,delay,rate\n" + "\n".join(rows) + "\n")
    (folder / "flip.yaml").write_text("name: flip\ndescription: delay and rate flip every 100 ms\n"
                                      "links: {default: {trace: flip.csv}}\n")
    return load_profile(folder / "flip.yaml")


@pytest.fixture(scope="module")
def cluster(docker_client: Any, worker_image: str) -> Iterator[Cluster]:
    """Name: cluster. Scope: module. Depends: docker_client, worker_image. Two workers without torch."""
    with Cluster(calibration_spec(N), client=docker_client) as c:
        yield c


@pytest.fixture(scope="module", params=_backends())
def shaper(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Shaper]:
    """Name: shaper. Scope: module, once per backend. Depends: cluster."""
    s = open_shaper(cluster.endpoints(), run_id=f"{cluster.run_id}t{request.param[0]}", backend=request.param)
    try:
        yield s
    finally:
        s.close()


class ClassBytes:
    """Reads the byte counter of the 0 -> 1 HTB class in node 0's namespace, over and over."""

    def __init__(self, netns: str, device: str) -> None:
        self.netns = netns
        self.device = device
        self.readings: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        out = subprocess.run(["nsenter", f"--net={self.netns}", "tc", "-s", "class", "show", "dev", self.device],
                             capture_output=True, text=True, check=True, timeout=10).stdout
        found = re.search(rf"class htb 1:{peer_minor(1):x} .*?\n\s*Sent (\d+) bytes", out, re.DOTALL)
        assert found, f"no class 1:{peer_minor(1):x} in node 0: {out}"
        return int(found.group(1))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.readings.append(self.read())

    def __enter__(self) -> ClassBytes:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.readings.append(self.read())


def test_a_tcp_stream_survives_50_changes_in_place(cluster: Any, shaper: Shaper, tmp_path: Path) -> None:
    """Run as it is by the netem VM's guest too (``tests/netem_vm/guest_conformance.py``, on its namespaces)."""
    assert isinstance(shaper, SchedulingShaper)
    n = len(cluster.endpoints())
    timeline = link_timeline(trace_profile(tmp_path), n, STREAM_S)
    assert len(timeline) == CHANGES + 1
    changes = shaper.schedule(timeline)
    lead = LEAD_S + 0.05 * n
    changes.go(time.monotonic() + lead + 0.5)
    sender = cluster.endpoints()[0]
    with ClassBytes(sender.netns, sender.device) as counter:
        seen = run_tcp(cluster, [TransferPlan((0, 1), 0.0, STREAM_S, 0.2)])[(0, 1)]
    applied = changes.finish()
    shaper.check()
    assert seen.error is None, f"the stream broke: {seen.error}"
    assert seen.goodput_bps and seen.goodput_bps > 1e6, seen
    assert [a.index for a in applied] == list(range(1, CHANGES + 1))
    assert all(not a.errors for a in applied), [a.errors for a in applied if a.errors]
    readings = counter.readings
    # read every 0.2 s here (each read takes about a second under the netem VM's emulation)
    assert len(readings) >= 4 and readings[-1] > readings[0], readings
    assert all(b >= a for a, b in itertools.pairwise(readings)), f"the class was re-created: {readings}"
