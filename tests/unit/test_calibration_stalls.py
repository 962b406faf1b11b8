"""The host-stall policy: what a stall is, how it is counted, when it leaves a check unknown, and the
policy scaled to a noisier path (pure: seeded samples, no host). The policy is a value each judge is
handed, never state: two policies judge the same samples side by side."""

from __future__ import annotations

import math
import random

import pytest

from squall.calibration import judge, segments, stalls, verdicts
from squall.calibration.expected import DelayModel
from squall.calibration.stats import Moments
from squall.calibration.verdicts import check_delay, check_jitter, check_rate


def test_no_policy_is_held_in_force_anywhere() -> None:
    """Nothing to swap: the stall module keeps no policy of its own, and no judge reads one from a module."""
    assert not {"policy", "use", "using", "_in_force"} & set(vars(stalls))
    for module in (verdicts, judge, segments):
        held = [name for name, value in vars(module).items() if isinstance(value, stalls.StallPolicy)]
        assert held in ([], ["HOST"]), (module.__name__, held)  # only the default an entry point names


def test_the_quiet_hosts_policy() -> None:
    host = stalls.HOST
    assert host == stalls.StallPolicy()
    assert (host.sigmas, host.floor_us) == (6.0, 1000.0)
    assert (host.hidden_share, host.judge_share, host.probe_share, host.retry_share) == (0.05, 0.10, 0.25, 0.10)
    assert (host.tries, host.canary_p99_us, host.delay_floor_us, host.jitter_floor_us) == (3, 500.0, 500.0, 250.0)


@pytest.mark.parametrize("sd_us, window, limit", [
    (0.0, 1000.0, 0.10),  # no jitter: the floor, judged up to the judge share
    (100.0, 1000.0, 0.10),  # 6 s.d. inside the floor
    (5_000 / math.sqrt(3), 6 * 5_000 / math.sqrt(3), 0.05),  # a wide law: its own window, the hidden share
])
def test_window_and_limit(sd_us: float, window: float, limit: float) -> None:
    assert stalls.HOST.window_us(sd_us) == pytest.approx(window)
    assert stalls.HOST.limit(sd_us) == limit


def test_stalls_are_left_out_of_the_moments() -> None:
    core = [5000.0 + (i % 7) * 10 for i in range(995)]
    late = [9000.0, 12000.0, 7000.0, 8000.0, 15000.0]
    moments, left_out = stalls.without_stalls(core + late, half_width=1000.0)
    assert left_out == 5
    assert moments == Moments.of(core)
    assert Moments.of(core + late).sd > 10 * moments.sd  # what the stalls would have done
    empty, none_left_out = stalls.without_stalls([], 1.0)
    assert (empty.count, none_left_out) == (0, 0)
    assert stalls.within(core + late, 1000.0) == core
    assert stalls.HOST.split(core + late, 0.0) == (moments, 5)


def test_a_noisier_path_scales_every_bound() -> None:
    rng = random.Random(3)
    quiet = [2_000 + rng.gauss(0, 50) for _ in range(900)]
    tailed = quiet[:720] + [2_000 + rng.uniform(4_000, 9_000) for _ in range(180)]  # 20 % beyond 3 ms
    path = stalls.HOST.on_path(500.0, [quiet, tailed, []])
    assert path.floor_us == 3_000.0  # 6 s.d. of the path
    assert path.delay_floor_us == 1_500.0 and path.jitter_floor_us == 1_000.0  # 3 and 2 s.d.
    assert path.path_tail == pytest.approx(0.20)
    assert (path.hidden_share, path.judge_share, path.probe_share) == pytest.approx((0.25, 0.30, 0.45))
    assert (path.retry_share, path.tries) == (0.10, 3)  # trying again costs only time: not raised
    assert path.window_us(0.0) == 3_000.0 and path.window_us(1_000.0) == 6_000.0
    narrow = stalls.HOST.on_path(10.0, [quiet])  # a quiet path keeps the quiet host's bounds
    assert (narrow.floor_us, narrow.delay_floor_us, narrow.jitter_floor_us) == (1000.0, 500.0, 250.0)
    assert (narrow.judge_share, narrow.probe_share) == (0.10, 0.25)


def test_the_canary_bound_follows_an_idle_hosts_own_lateness() -> None:
    assert stalls.HOST.with_canary(100.0).canary_p99_us == 500.0  # a quiet host keeps 0.5 ms
    assert stalls.HOST.with_canary(4_000.0).canary_p99_us == 12_000.0  # three times a slow idle host's


def test_the_policy_passed_is_what_the_checks_judge_by() -> None:
    """A 1 ms link read 1.8 ms is failed on a quiet host, judged within tolerance on a path whose floor
    is 3 s.d. of 0.5 ms; 20 % of a probe stalled is unknown on a quiet host and judged on the noisy path.
    The two policies are used alternately: each verdict follows the policy it was handed, whatever
    was judged before it."""
    samples = [1_800.0 + (i % 5) for i in range(300)]
    model = DelayModel(1_000, 0)
    noisy = stalls.HOST.on_path(500.0, [[0.0] * 80 + [10_000.0] * 20])
    for _ in range(2):
        assert check_delay((0, 1), model, Moments.of(samples), 0, samples=samples,
                           policy=stalls.HOST).verdict == "failed"
        assert check_delay((0, 1), model, Moments.of(samples), 0, samples=samples, policy=noisy).verdict == "passed"
        busy = check_jitter((0, 1), model, Moments.of(samples), 0, samples=samples, host_stalls=0.2, policy=noisy)
        assert busy.verdict == "passed"  # 0.2 is within the raised judge share (0.30)
        busy = check_jitter((0, 1), model, Moments.of(samples), 0, samples=samples, host_stalls=0.2,
                            policy=stalls.HOST)
        assert busy.verdict == "unknown" and stalls.TOO_BUSY in busy.why
        assert check_rate((0, 1), 1e9, 600e6, 1448, host_stalls=0.2, policy=stalls.HOST).verdict == "unknown"
        assert check_rate((0, 1), 1e9, 600e6, 1448, host_stalls=0.2, policy=noisy).verdict == "failed"


def test_a_delay_short_even_with_the_stalls_fails_however_busy_the_host() -> None:
    """Stalls only add delay: a 10 ms link read at 5.4 ms with 12 % of its packets stalled is failed,
    and the same stalls on a link read near 10 ms leave it unknown."""
    model = DelayModel(10_000, 0)
    short = [5_400.0 + (i % 5) for i in range(440)] + [9_000.0] * 60
    row = check_delay((0, 1), model, Moments.of(short), 250.0, samples=short, host_stalls=0.126, policy=stalls.HOST)
    assert row.verdict == "failed" and "cannot explain" in row.why
    near = [10_000.0 + (i % 5) for i in range(440)] + [14_000.0] * 60
    row = check_delay((0, 1), model, Moments.of(near), 0.0, samples=near, host_stalls=0.126, policy=stalls.HOST)
    assert row.verdict == "unknown" and stalls.TOO_BUSY in row.why
