"""ksoftirqd's run-queue wait as the netem VM's guest reads it (tests/netem_vm/guest_conformance.py), fake /proc."""

from __future__ import annotations

from pathlib import Path

from tests.netem_vm.guest_conformance import ksoftirqd_wait_s


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
