"""ksoftirqd's run-queue wait as the netem VM's guest reads it (tests/netem_vm/guest_sched.py), fake /proc."""

from __future__ import annotations

from pathlib import Path

from tests.netem_vm.guest_sched import ksoftirqd_wait_s


def _task(proc: Path, pid: int, comm: str, schedstat: str) -> None:
    (proc / str(pid)).mkdir()
    (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / str(pid) / "schedstat").write_text(schedstat + "\n")


def test_sums_the_waits_of_the_ksoftirqd_threads_only(tmp_path: Path) -> None:
    _task(tmp_path, 14, "ksoftirqd/0", "100 2500000000 7")
    _task(tmp_path, 21, "ksoftirqd/1", "100 500000000 3")
    _task(tmp_path, 300, "python3", "100 9000000000 9")  # another task's wait is not counted
    (tmp_path / "self").mkdir()  # not a pid
    assert ksoftirqd_wait_s(tmp_path) == 3.0


def test_a_task_gone_or_malformed_is_skipped(tmp_path: Path) -> None:
    _task(tmp_path, 14, "ksoftirqd/0", "garbage")
    (tmp_path / "15").mkdir()  # exited between listing and reading: no files
    _task(tmp_path, 21, "ksoftirqd/1", "1 1000000000 1")
    assert ksoftirqd_wait_s(tmp_path) == 1.0


def test_the_guest_suite_refuses_to_load_in_a_host_session() -> None:
    """``guest_conformance`` restates the host's MIXED profile and calibration probe rate as it is imported:
    loaded by a host test (as this file once did) it changed them for every host test after it."""
    import importlib
    import sys

    import pytest

    from squall.calibration import plan
    from tests.integration import test_shaping_conformance as suite

    mixed, rate = suite.MIXED, plan.UDP_RATE_PPS
    assert "tests.netem_vm.guest_plugin" not in sys.modules
    with pytest.raises(ImportError, match="runs only in the netem VM's guest"):
        importlib.import_module("tests.netem_vm.guest_conformance")
    assert suite.MIXED is mixed and rate == plan.UDP_RATE_PPS
