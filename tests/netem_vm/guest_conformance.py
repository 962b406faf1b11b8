"""The shaping conformance suite and a calibration, netem backend, inside the netem VM (no Docker).

Run by ``scripts/netem-vm/guest.sh`` inside the guest only (its name does not start with ``test_``,
so the host's pytest never collects it). Every test of
``tests/integration/test_shaping_conformance.py`` is imported unchanged (same probes, same verdict
functions, same tolerances); only two fixtures differ: ``cluster`` is four plain namespaces on a
bridge with an agent each (:mod:`tests.netem_vm.nscluster`) instead of containers, and ``shaper``
is the netem backend only (the guest kernel has ``sch_netem``; the nfqueue backend is tested on
the host). TCG's own cost on a packet's path is in the unshaped ``baseline`` the delay checks
subtract, as on the host. After the suite, ``calibrate`` runs on the same hosts (its JSON report
goes to the results share), with the suite's shaper closed first.

Measured on a 2-core host shared with other work (Debian 6.1.192 under multi-threaded TCG): the
kernel applies every state of both suites (after the netem backend's duplication moved to TEE),
10 and 100 Mbit/s pass. At the suite's 500 probes/s on 12 links, four Python probes on two emulated
CPUs fell behind (echoes queued for hundreds of ms, socket buffers overflowed), which failed the
loss, partition and phase checks; so the guest probes at :data:`GUEST_RATE_PPS` (same counts,
longer probes) from real-time agents (:mod:`tests.netem_vm.nscluster`). TCG's own stalls (the
guest's clock is the host's, and QEMU is descheduled whenever the host is busy) still make most
millisecond delay checks answer "too busy" on a loaded host: they skip, never pass. The guest's
``mixed`` and ``phase_run`` fixtures are the suite's plus one rule: while even the least stalled try
had more than MAX_STALL_FRACTION of a link's packets stalled, their tests skip as too busy (a guest
that far behind loses echoes in its own buffers); the partition test is retried under the canary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.calibration import plan as calibration_plan
from harness.calibration import runner as calibration_runner
from harness.calibration.judge import Baseline, stalled_fraction
from harness.calibration.observations import Sample, UdpObservation, raw_samples
from harness.calibration.probing import finish_udp, run_udp, start_udp
from harness.calibration.runner import STALL_TRIES
from harness.calibration.verdicts import MAX_STALL_FRACTION, CalibrationOutcome
from harness.shaping import Shaper, open_shaper, state_at
from tests.integration import test_shaping_conformance as suite
from tests.integration.test_shaping_conformance import (  # noqa: F401  (collected here: the suite itself)
    baseline,
    rates,
    test_a_per_pair_setting_changes_only_that_pair,
    test_a_phase_takes_effect_within_100_ms,
    test_delay_mean,
    test_jitter_sd,
    test_links_without_settings_stay_untouched,
    test_loss_inside_the_99_percent_binomial_region,
    test_rate,
)
from tests.netem_vm.nscluster import NamespaceCluster
from tests.timing import judged, retrying

OUT = Path(os.environ.get("NETEM_VM_RESULTS", "/tmp/netem-vm-out"))
#: Probes per second per link in the guest. The suite's 500/s on 12 links (6000 datagrams/s plus their
#: echoes) overran four Python probes on two emulated CPUs: echoes queued for hundreds of ms (read as
#: "host stalls") and overflowed socket buffers (read as loss). The counts stay, so every check keeps
#: its sample size and its power; only the probes take longer.
GUEST_RATE_PPS = float(os.environ.get("NETEM_VM_RATE_PPS", "100"))
suite.RATE_PPS = GUEST_RATE_PPS  # the suite reads its module constants when a test runs
calibration_plan.UDP_RATE_PPS = GUEST_RATE_PPS
CALIBRATED = ("wan-5ms", "lossy-1pct", "thin-20mbit")  # the profiles issue 14 names
CALIBRATED_PAIRS = [(0, 1), (1, 0)]  # two directions (the suite covers the rest)
# quick: the loss check asks half the resolution (fewer packets) and transfers are shorter (at the
# guest's probe rate a full lossy-1pct probe takes 33 s a try); the same checks, the same tolerances


@pytest.fixture(scope="module")
def cluster() -> Iterator[NamespaceCluster]:
    """Name: cluster. Scope: module. Four namespaces on a bridge, an agent in each (no Docker in the VM)."""
    with NamespaceCluster(suite.N) as c:
        yield c


@pytest.fixture(scope="module", params=["netem"])
def shaper(request: pytest.FixtureRequest, cluster: NamespaceCluster,
           baseline: Baseline) -> Iterator[Shaper]:  # noqa: F811  (the suite's fixture, by name)
    """Name: shaper. Scope: module. Depends: cluster, baseline. The netem backend; closed after its tests."""
    s = open_shaper(cluster.endpoints(), run_id=f"{cluster.run_id}{request.param[0]}", backend=request.param)
    assert s.backend == request.param
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def mixed(cluster: NamespaceCluster, shaper: Shaper) -> UdpObservation:
    """Name: mixed. Scope: module. Depends: shaper. The suite's mixed probe (same state, count, tries).

    Unlike on the host, every test on it skips as too busy while even the least stalled try had more
    than MAX_STALL_FRACTION of some link's packets stalled: a guest that far behind loses echoes in
    its own socket buffers (RTTs of 1-2 s and 42 % "loss" on a 10 % link were measured so), which the
    loss checks would read as the link's. A guest that keeps up is judged exactly as the suite judges.
    """
    state = state_at(suite.MIXED, suite.N, 0.0)
    shaper.apply(state)
    obs = suite._judgeable(state, lambda: run_udp(cluster, suite.EVERY, count=suite.MIXED_COUNT,  # type: ignore[arg-type]
                                                  rate_pps=suite.RATE_PPS, wait_s=0.9)[0], shaper)
    stalled = stalled_fraction(state, obs)
    if stalled > MAX_STALL_FRACTION:
        pytest.skip(f"the guest stalled {100 * stalled:.1f} % of a link's packets in the mixed probe (more than "
                    f"{100 * MAX_STALL_FRACTION:g} %): too busy to judge delay, jitter or loss")
    return obs


@pytest.fixture(scope="module")
def phase_run(cluster: NamespaceCluster,
              shaper: Shaper) -> tuple[UdpObservation, dict[tuple[int, int], list[Sample]], float]:
    """Name: phase_run. Scope: module. Depends: shaper. The suite's probe across the phase change (same
    profile, tries and choice of the least stalled); its tests skip as too busy, as :func:`mixed`'s do,
    while even that try had more than MAX_STALL_FRACTION of a link's packets stalled (a guest 1.4 s
    behind lost packets across the change and had none in the half second before it)."""
    before = state_at(suite.PHASED, suite.N, 0.0)
    tries = []
    for _ in range(STALL_TRIES):
        shaper.apply(before)
        run = start_udp(cluster, suite.EVERY, count=int(2.5 * suite.RATE_PPS),  # type: ignore[arg-type]
                        rate_pps=suite.RATE_PPS, wait_s=0.5)
        due = suite._apply_at(shaper, suite.PHASED, suite.PHASE_AT_S, run.start_wall)
        obs, results = finish_udp(run, suite.EVERY)
        shaper.check()
        tries.append((obs, raw_samples([m for r in results for m in r.metrics()]), due))
        if stalled_fraction(before, obs) <= MAX_STALL_FRACTION:
            break
    best = min(tries, key=lambda t: stalled_fraction(before, t[0]))
    stalled = stalled_fraction(before, best[0])
    if stalled > MAX_STALL_FRACTION:
        pytest.skip(f"the guest stalled {100 * stalled:.1f} % of a link's packets in the phase probe (more than "
                    f"{100 * MAX_STALL_FRACTION:g} %): too busy to judge the phase change")
    return best


def test_a_partition_blocks_and_a_heal_restores(cluster: NamespaceCluster, shaper: Shaper) -> None:
    """The suite's test, retried as the timing tests are (:func:`tests.timing.retrying`): an echo that a
    stalled guest sends after the probe stopped waiting reads as a lost packet; a failure while the
    guest's real-time canary saw no stall fails it."""
    retrying(lambda: suite.test_a_partition_blocks_and_a_heal_restores(cluster, shaper),  # type: ignore[arg-type]
             "partition and heal")


@pytest.mark.parametrize("profile", CALIBRATED)
def test_calibration_on_netem(cluster: NamespaceCluster, shaper: Shaper, profile: str) -> None:
    shaper.close()  # the suite is done with it; calibrate() opens its own on the same hosts
    report = calibration_runner.calibrate(profile, workers=suite.N, backend="netem", pairs=CALIBRATED_PAIRS,
                                          quick=True, cluster=cluster)  # type: ignore[arg-type]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"calibration-{profile}.json").write_text(report.to_json())
    assert report.backend == "netem" and not report.errors, report.format()
    # As the suite judges a row (tests.timing.judged): a failed row fails; a row the host was too busy
    # to judge skips the test with its reason, but only once no row failed.
    failed = [r for r in report.rows if r.verdict == CalibrationOutcome.FAILED]
    assert not failed, report.format()
    for row in report.rows:
        judged(row)
