"""The ctypes timerfd: absolute arming, re-arming and disarming, as the daemon's loop uses it."""

from __future__ import annotations

import select
import time

from squall.shaping.nfqueue.daemon import now_us
from squall.shaping.nfqueue.timer import TimerFd


def _fires_within(timer: TimerFd, seconds: float) -> bool:
    ready, _, _ = select.select([timer], [], [], seconds)
    return bool(ready)


def test_fires_at_the_absolute_time() -> None:
    timer = TimerFd()
    try:
        start = now_us()
        timer.arm(start + 20_000)
        assert not _fires_within(timer, 0.005)
        assert _fires_within(timer, 1.0)
        assert now_us() - start >= 20_000
    finally:
        timer.close()


def test_past_time_fires_at_once_and_rearm_clears_the_expiry() -> None:
    timer = TimerFd()
    try:
        timer.arm(now_us() - 1_000)
        assert _fires_within(timer, 0.5)
        timer.fired()  # the daemon does not read the counter ...
        timer.arm(now_us() + 10_000_000)  # ... re-arming resets it
        assert not _fires_within(timer, 0.01)
        timer.disarm()
        assert timer.armed_at is None
        assert not _fires_within(timer, 0.01)
    finally:
        timer.close()


def test_disarm_after_fired_clears_the_expiry() -> None:
    timer = TimerFd()
    try:
        timer.arm(now_us())
        time.sleep(0.002)
        timer.fired()
        timer.disarm()
        assert not _fires_within(timer, 0.01)
    finally:
        timer.close()
