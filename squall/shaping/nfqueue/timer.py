"""An absolute ``CLOCK_MONOTONIC`` timerfd through ctypes (``os.timerfd_*`` arrived in 3.13).

epoll's own timeout has millisecond resolution, far too coarse for release times; a timerfd
registered in the same epoll set wakes the loop with nanosecond resolution (hrtimer) and no timer
slack. Times are integer microseconds of ``time.monotonic_ns() // 1000``, the clock the daemon
stamps arrivals with.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = os.O_CLOEXEC
TFD_TIMER_ABSTIME = 1

_libc = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """A one-shot timer armed at absolute monotonic microseconds."""

    def __init__(self) -> None:
        fd = _libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self.fd: int = fd
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)
        self.armed_at: int | None = None  # microseconds, or None when disarmed or fired
        self._disarmed = True  # no expiry pending or unread

    def fileno(self) -> int:
        """The timer's file descriptor, for epoll."""
        return self.fd

    def arm(self, when_us: int) -> None:
        """Fire at ``when_us`` (in the past: at once); re-arming moves the single expiry."""
        if when_us == self.armed_at:
            return
        secs, usecs = divmod(max(when_us, 1), 1_000_000)
        value = self._spec.it_value
        value.tv_sec = secs
        value.tv_nsec = usecs * 1000
        self._settime()
        self.armed_at = when_us
        self._disarmed = False

    def disarm(self) -> None:
        """Stop the timer (also clears an expiry that :meth:`fired` did not read)."""
        if self.armed_at is None and self._disarmed:
            return
        self._disarmed = True
        value = self._spec.it_value
        value.tv_sec = 0
        value.tv_nsec = 0
        self._settime()
        self.armed_at = None

    def _settime(self) -> None:
        if _libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, self._ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def fired(self) -> None:
        """Note an expiry without reading the counter: the next :meth:`arm` or :meth:`disarm`
        (``timerfd_settime``) resets it, which saves a syscall per wake-up."""
        self.armed_at = None

    def consume(self) -> None:
        """Acknowledge an expiry (read the counter) so epoll stops reporting it."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.fd, 8)
        self.armed_at = None

    def close(self) -> None:
        """Close the file descriptor."""
        os.close(self.fd)
