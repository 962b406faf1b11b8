"""The per-module time table of the containers' tests (tests/module_times.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.module_times import ModuleClock, cpu_busy_s

REPO = Path(__file__).resolve().parents[2]


def test_a_row_per_run_of_a_module_with_its_tests_counted() -> None:
    clock = ModuleClock()
    for module in ("a.py", "a.py", "b.py", "a.py"):
        clock.start(module)
    clock.close()
    assert [(r.module, r.tests) for r in clock.rows] == [("a.py", 2), ("b.py", 1), ("a.py", 1)]
    assert all(r.wall_s >= 0 and r.busy_core_s >= 0 for r in clock.rows)


def test_busy_time_grows_with_work() -> None:
    before = cpu_busy_s()
    end = before + 0.2
    while cpu_busy_s() < end:  # spins until the host counted 0.2 s more busy time: this process's at least
        pass
    assert cpu_busy_s() >= end


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
    assert "all 2 modules (4 tests)" in proc.stdout
