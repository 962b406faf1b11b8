"""Run ownership: who owns a run and whether it is still alive (no Docker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from squall.cluster.ownership import Owner, new_run_id, read_owner, write_owner


def test_run_ids_are_short_and_distinct() -> None:
    ids = {new_run_id() for _ in range(200)}
    assert len(ids) == 200 and all(len(i) == 10 for i in ids)


def test_the_current_process_is_alive_and_a_finished_one_is_not() -> None:
    assert Owner.me().alive()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    me = Owner.me()
    assert not Owner(me.host, proc.pid, me.start).alive()


def test_a_recycled_pid_is_not_the_owner() -> None:
    me = Owner.me()
    assert not Owner(me.host, me.pid, me.start - 1000).alive()


def test_another_hosts_runs_are_not_judged_here() -> None:
    assert Owner("some-other-host", 1, 0.0).alive()


def test_owner_round_trips_through_labels_and_file(tmp_path: Path) -> None:
    me = Owner.me()
    assert Owner.from_labels(me.labels("abc", tmp_path)) == Owner(me.host, me.pid, round(me.start, 3))
    write_owner(tmp_path, me, "abc")
    assert read_owner(tmp_path) is not None
    assert read_owner(tmp_path / "missing") is None
