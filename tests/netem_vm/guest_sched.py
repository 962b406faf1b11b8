"""The guest's ksoftirqd waits (its schedstat): a side-effect-free module, so that host unit tests can import it.

``guest_conformance`` restates the host's suites for the guest at import (the host's ``MIXED`` profile,
the calibration probe rate): importing it in a host session changed those for every host test after it
(a CI rehearsal's host rate row then expected 20 Mbit/s for a 100 Mbit/s link, and a calibration plan test
saw the guest's probe rate), so what the host may use lives here.
"""

from __future__ import annotations

from pathlib import Path


def ksoftirqd_wait_s(proc: Path = Path("/proc")) -> float:
    """Seconds the guest's ksoftirqd threads have waited on a run queue so far (their schedstat).

    Why recorded: the timer that releases the packets netem holds runs as a softirq, which this kernel
    hands to ksoftirqd under load; while that thread waited for a CPU behind the real-time probes, a
    2 ms link's packets read as stalls (scripts/netem-vm/guest.sh, which raises its priority)."""
    total = 0
    for task in proc.iterdir():
        if not task.name.isdigit():
            continue
        try:
            if (task / "comm").read_text().startswith("ksoftirqd/"):
                total += int((task / "schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9
