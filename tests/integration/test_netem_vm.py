"""The netem backend on a real netem kernel: Debian's 6.1 kernel under QEMU, its results as tests here.

This host's kernel has no ``sch_netem``; a stock distribution kernel has it.
``scripts/netem-vm/run.sh`` boots one under QEMU TCG (docs/testing.md; the kernel is fetched
with ``apt-get download`` and cached in ``.cache/netem-vm``, never committed) with this checkout
shared read-only, and the guest runs every netem test of ``test_shaping_backends`` and the
conformance suite (``tests/netem_vm/rows.py`` lists them, some restated for TCG) plus calibrations.
The VM runs once per session (7-9 minutes on a 2-core host, holding the QEMU lock, and the
benchmark lock when it can be had, see :func:`guest`); each guest test then becomes one test here
with the guest's outcome: passed, failed (with the guest's failure text) or skipped (with its reason).

The guest's own clock cannot tell a host that starved the VM from its own emulation cost, so a
guest "too busy" skip stands only when the host saw it: while the VM runs,
``tests/netem_vm/host_watch.py`` reads QEMU's threads' run-queue waits (the kernel's schedstat) and
this machine's steal time (the CPU time its own hypervisor took), and a skipped guest test whose
busiest virtual CPU (or QEMU main) thread waited less than :data:`STARVED_SHARE` of that test's time
for a host CPU, the stolen share added, fails instead ("the guest cannot judge this check as it
stands"). The samples and each row's figures are left in the results directory
(``host_sched.jsonl``, ``rows.json``).

It is part of ``make test`` (``make test-netem`` runs it alone). Earlier full runs passed four of six
beside a CPU-bound process, and a quiet fresh-clone run failed the per-pair phase row: the guest
stalled its probes without host load to explain it. The cause was the guest's ``ksoftirqd`` (which
releases netem's held packets) starved by the real-time probe agents; it now runs at real-time
priority above them (``scripts/netem-vm/guest.sh``), and the fresh-clone runs since then, quiet and
beside a CPU-bound process, passed with 0 failed and 0 skipped (README, testing section).
``SQUALL_NETEM_VM=0`` switches it off on a laptop that cannot spare the minutes (the host's own
``[netem]`` rows then run, or skip on a kernel without netem); under ``CI=true`` that switch is
refused (every test here fails saying so), and anything that keeps the VM from running (no root, no
QEMU or kernel package to be had from apt, a VM that dies) is a failure; elsewhere it skips with the
reason. A VM killed at its time limit fails every guest test that did not run. On a kernel without
netem the host's own ``[netem]`` rows are deselected where these rows stand for them
(``tests/conftest.py``), which :func:`test_every_host_netem_test_has_a_guest_row` keeps honest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.cluster.engine import in_ci
from tests.netem_vm.host_watch import QemuWatch, starved_by_row
from tests.netem_vm.rows import (
    GUEST_TESTS,
    HOST_FILES,
    SWITCH,
    guest_row,
    is_netem_row,
    switch_refused,
    vm_switched_off,
)

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "scripts" / "netem-vm" / "run.sh"
VM_TIMEOUT_S = 960  # the VM's own limit (run.sh kills it); the test's is a little longer
QEMU_LOCK, BENCH_LOCK = "/tmp/squall-qemu.lock", "/tmp/squall-bench.lock"
#: A guest's "too busy" is accepted only when a virtual CPU thread of QEMU waited at least this share of the
#: test's time for a host CPU, or lost it to this machine's hypervisor (steal), the two added
#: (tests/netem_vm/host_watch.py); else the skip is a failure.
STARVED_SHARE = 0.05
MIN_WINDOW_S = 30.0  # the shortest window judged: about a shared probe's length (the mixed probe: 15-45 s)
BENCH_WAIT_S = float(os.environ.get("SQUALL_NETEM_VM_BENCH_WAIT_S", "120"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(VM_TIMEOUT_S + 400)]  # whichever test boots the VM
def _unable(why: str) -> None:
    if in_ci():
        pytest.fail(f"the netem VM cannot run: {why} (CI=true: a missing prerequisite is a failure, not a skip)")
    pytest.skip(f"the netem VM cannot run: {why}")


@contextlib.contextmanager
def _exclusive(path: str, *, wait_s: float | None, skip: bool = False) -> Iterator[bool]:
    """Hold the flock on ``path`` for the block; wait for it at most ``wait_s`` (None: for ever).
    Yields whether it is held (``skip``: the caller holds it; True without locking)."""
    if skip:
        yield True
        return
    with open(path, "a") as f:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(1.0)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Name: guest. Scope: module. Boots the VM once; the guest's outcome per test id (progress.jsonl)."""
    if switch_refused():
        pytest.fail(f"{SWITCH}=0 is refused under CI=true: CI runs the netem backend on the netem VM")
    if vm_switched_off():
        pytest.skip(f"the netem VM is switched off ({SWITCH}=0); the host's own [netem] rows run instead "
                    "(or skip on a kernel without netem)")
    if os.geteuid() != 0:
        _unable("needs root (QEMU packages from apt, namespaces, tc in the guest)")
    out = tmp_path_factory.mktemp("netem-vm")
    env = {**os.environ, "NETEM_VM_OUT": str(out), "NETEM_VM_TIMEOUT": str(VM_TIMEOUT_S)}
    # One VM at a time; the benchmark lock too when it can be had within BENCH_WAIT_S (always, on a
    # machine of its own): then no timing measurement runs beside the VM and QEMU may take the CPU
    # (nice -20). On a shared machine where others' benchmarks hold it for long, the VM runs at
    # ordinary priority instead, so it spoils no one's figures (and its own delay checks are more
    # often "too busy").
    # SQUALL_NETEM_VM_LOCKS_HELD=1: the caller holds both already (flock ... flock ... make test-netem);
    # a second flock here, on a new open file, would wait for the caller's for ever.
    held = os.environ.get("SQUALL_NETEM_VM_LOCKS_HELD") == "1"
    with _exclusive(QEMU_LOCK, wait_s=None, skip=held), \
            _exclusive(BENCH_LOCK, wait_s=BENCH_WAIT_S, skip=held) as bench:
        if not bench:
            env["NETEM_VM_NICE"], env["NETEM_VM_RT"] = "0", "0"
        returncode, stderr, watch = _run_vm(env)
    watch.save(out / "host_sched.jsonl")
    rows: dict[str, dict[str, Any]] = {}
    progress = out / "progress.jsonl"
    if progress.exists():
        for line in progress.read_text().splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                rows[row["test"]] = row
    if not rows:
        console = (out / "console.log").read_text(errors="replace")[-2000:] if (out / "console.log").exists() else ""
        _unable(f"run.sh exited {returncode} and the guest reported no test:\n{stderr[-3000:]}\n{console}")
    # The guest's clock is set from the host's RTC at boot (whole seconds); the share's file times are the
    # host's: the last line's write time puts the guest's wall times on the host's clock.
    offset = progress.stat().st_mtime - max(float(r.get("wall", 0.0)) for r in rows.values())
    for test, share in starved_by_row(list(rows.values()), watch.samples, offset, min_window_s=MIN_WINDOW_S,
                                      cpus=os.cpu_count() or 1).items():
        rows[test]["host_starved"] = share
    (out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def _run_vm(env: dict[str, str]) -> tuple[int, str, QemuWatch]:
    """run.sh in a session of its own (its own scheduler autogroup, whose nice run.sh lowers, and one
    process group to end on any way out: a test timeout, Ctrl-C), with QEMU's run-queue waits watched.
    Returns its exit code, its stderr and the watch."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(["bash", str(RUN)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                text=True, start_new_session=True)
        try:
            with QemuWatch(proc.pid) as watch:
                returncode = proc.wait(timeout=VM_TIMEOUT_S + 300)  # + preparing: apt, kernel, initramfs
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err.seek(0)
        return returncode, err.read(), watch


def test_the_guest_ran_exactly_the_listed_tests(guest: dict[str, dict[str, Any]]) -> None:
    assert sorted(guest) == sorted(GUEST_TESTS), (
        f"ran but not listed: {sorted(set(guest) - set(GUEST_TESTS))}; "
        f"listed but did not run (a VM killed at its time limit?): {sorted(set(GUEST_TESTS) - set(guest))}")


def test_every_host_netem_test_has_a_guest_row() -> None:
    """Every [netem] row the host's suites have (collected here in a separate pytest, where nothing is
    deselected) has a guest row that runs it: the VM's rows may stand for them (tests/conftest.py)
    only because they cover all of them."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *HOST_FILES], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    host = [line.strip() for line in proc.stdout.splitlines() if is_netem_row(line.strip())]
    assert len(host) >= 20, f"the host's suites have only {len(host)} netem rows?\n{proc.stdout[-2000:]}"
    uncovered = [n for n in host if guest_row(n) not in GUEST_TESTS]
    assert not uncovered, f"host netem tests the guest does not run: {uncovered}"


@pytest.mark.parametrize("test_id", GUEST_TESTS, ids=[t.split("::")[1] for t in GUEST_TESTS])
def test_in_the_netem_vm(guest: dict[str, dict[str, Any]], test_id: str) -> None:
    row = guest.get(test_id)
    assert row is not None, f"{test_id} did not run in the guest"
    if row["outcome"] == "skipped":
        waited, ran, stolen = row.get("host_starved", (0.0, 0.0, 0.0))
        host = (f"QEMU's busiest virtual CPU thread waited for a host CPU {100 * waited:.1f} % of that time "
                f"(ran {100 * ran:.0f} %) and this machine's hypervisor stole {100 * stolen:.1f} % of its CPUs' time")
        if waited + stolen >= STARVED_SHARE:
            pytest.skip(f"in the netem VM: {row['text']} [the host starved the VM: {host}]")
        pytest.fail(f"in the netem VM the guest called the host too busy, but the host was not: {host}, less "
                    f"than {100 * STARVED_SHARE:g} % together; the guest cannot judge this check as it stands:\n"
                    f"{row['text']}")
    assert row["outcome"] == "passed", f"in the netem VM ({row['when']}):\n{row['text']}"
