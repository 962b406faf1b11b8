"""Timing measurements on a shared host: a measurement may be tried again when a host stall spoilt it.

The host these tests run on is a small VM (2 cores here and in CI) that is now and then descheduled
for tens of milliseconds (steal time): every packet in flight then arrives late and a TCP transfer
loses a slice of its time, whatever the code under test does. :func:`retrying` runs a measurement
together with its assertions up to :data:`ATTEMPTS` times and passes on the first clean attempt, so
a stall does not fail the suite; code that shapes or times wrongly fails every attempt, and the
failure then lists them all. Only measurements of time go through it, never functional checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

logger = logging.getLogger(__name__)

ATTEMPTS = 3


def retrying(measure: Callable[[], None], what: str, *, attempts: int = ATTEMPTS) -> None:
    """Run ``measure`` (a measurement and its assertions) until one attempt passes, at most ``attempts``."""
    failures = []
    for attempt in range(1, attempts + 1):
        try:
            measure()
            return
        except AssertionError as exc:
            failures.append(f"attempt {attempt}: {exc}")
            logger.warning("%s: attempt %d of %d failed (host stall?): %s", what, attempt, attempts, exc)
    pytest.fail(f"{what}: every attempt failed:\n" + "\n".join(failures))
