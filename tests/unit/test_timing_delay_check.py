"""The conformance tests' delay check (``tests.timing.assert_delay_without_stalls``): what counts as a
host stall depends on the link's own jitter, as in the calibration's verdicts."""

from __future__ import annotations

import random

import pytest

from squall.calibration.stalls import HOST
from tests.timing import HostTooBusy, assert_delay_without_stalls

UNIFORM_SD_US = 5_000 / 3 ** 0.5  # 20 ms +- 5 ms uniform


def _uniform(n: int = 1500, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    return [20_000 + rng.uniform(-5_000, 5_000) for _ in range(n)]


def test_a_jittered_link_is_judged_by_its_own_window() -> None:
    delays = _uniform()
    assert_delay_without_stalls(delays, 20_000, "uniform", tol_us=1_000, sd_us=UNIFORM_SD_US, policy=HOST)
    with pytest.raises(AssertionError, match="expected 25000"):  # and a wrong mean still fails
        assert_delay_without_stalls(delays, 25_000, "uniform", tol_us=1_000, sd_us=UNIFORM_SD_US, policy=HOST)


def test_with_the_constant_links_window_the_jitter_itself_reads_as_host_stalls() -> None:
    """What the uniform-jitter row did before: 80 % of its delays lie over 1 ms from the median, so
    every attempt was 'host too busy' and the row was skipped on any host."""
    with pytest.raises(HostTooBusy, match=r"left out as host stalls"):
        assert_delay_without_stalls(_uniform(), 20_000, "uniform", tol_us=1_000, policy=HOST)


def test_stalls_beyond_a_jittered_links_window_make_it_unknown_past_five_percent() -> None:
    delays = _uniform()
    few = delays[:]
    for i in range(0, 1500, 50):  # 2 %: 30 packets held 100 ms by the host
        few[i] += 100_000
    assert_delay_without_stalls(few, 20_000, "uniform", tol_us=1_000, sd_us=UNIFORM_SD_US, policy=HOST)
    many = delays[:]
    for i in range(0, 1500, 10):  # 10 %
        many[i] += 100_000
    with pytest.raises(HostTooBusy, match=r"150 more than 17\.3 ms"):
        assert_delay_without_stalls(many, 20_000, "uniform", tol_us=1_000, sd_us=UNIFORM_SD_US, policy=HOST)


def test_a_constant_link_keeps_the_1ms_window_and_the_quarter_limit() -> None:
    delays = [5_000.0 + (i % 7) * 10 for i in range(400)]
    for i in range(0, 400, 5):  # 20 % stalled: still judged, and the kept mean is right
        delays[i] += 30_000
    assert_delay_without_stalls(delays, 5_000, "constant", tol_us=500, policy=HOST)
    for i in range(1, 400, 5):  # 40 %
        delays[i] += 30_000
    with pytest.raises(HostTooBusy):
        assert_delay_without_stalls(delays, 5_000, "constant", tol_us=500, policy=HOST)
