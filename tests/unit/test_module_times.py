"""The per-module time table of the containers' tests (tests/module_times.py) and the CPU times it reads
(tests/timing.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.module_times import ModuleClock
from tests.timing import parse_cpu_times, read_cpu_times

REPO = Path(__file__).resolve().parents[2]


def test_a_row_per_run_of_a_module_with_its_tests_counted() -> None:
    clock = ModuleClock()
    for module in ("a.py", "a.py", "b.py", "a.py"):
        clock.start(module)
    clock.close()
    assert [(r.module, r.tests) for r in clock.rows] == [("a.py", 2), ("b.py", 1), ("a.py", 1)]
    assert all(r.wall_s >= 0 and r.busy_core_s >= 0 for r in clock.rows)


def test_busy_time_grows_with_work() -> None:
    end = read_cpu_times().busy_s + 0.2
    while read_cpu_times().busy_s < end:  # spins until the host counted 0.2 s more busy time: this process's at least
        pass
    assert read_cpu_times().busy_s >= end


def test_cpu_times_leave_idle_iowait_and_steal_out_of_busy_and_guest_time_is_not_counted_twice() -> None:
    #      user nice system idle iowait irq softirq steal guest guest_nice
    stat = "cpu  10 2 20 300 4 3 1 25 6 1\ncpu0 5 1 10 150 2 2 1 12 3 0\nintr 1\n"
    times = parse_cpu_times(stat, 100.0)
    assert (times.busy_s, times.steal_s) == pytest.approx((0.36, 0.25))
    times = parse_cpu_times("cpu  10 2 20 300 4 3 1\n", 100.0)  # a kernel without steal
    assert (times.busy_s, times.steal_s) == pytest.approx((0.36, 0.0))
    with pytest.raises(ValueError, match="no 'cpu' line"):
        parse_cpu_times("intr 1\n", 100.0)
def test_the_plugin_writes_each_module_and_prints_the_table(tmp_path: Path) -> None:
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    out = tmp_path / "times.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.module_times", f"--module-times={out}",
                           "-p", "no:cacheprovider", "-q", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert [(Path(r["module"]).name, r["tests"]) for r in rows] == [("test_one.py", 2), ("test_two.py", 2)]
    assert "where the time went (per module)" in proc.stdout
    assert "all 2 modules (4)" in proc.stdout  # the total row: modules (tests)
