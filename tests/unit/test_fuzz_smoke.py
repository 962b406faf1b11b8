"""A short run of every fuzz target (``make fuzz`` runs them for 10^6 inputs each): no finding allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

ROOT = Path(__file__).resolve().parents[2]
SMOKE_RUNS = 2000  # inputs per target, or
SMOKE_SECONDS = 10  # seconds per target, whichever comes first


def test_every_target_survives_a_short_run(tmp_path: Path) -> None:
    report = tmp_path / "fuzz.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz.run", "all", "--runs", str(SMOKE_RUNS), "--seconds", str(SMOKE_SECONDS),
         "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "FUZZ_RESULTS": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads(report.read_text())
    assert {row["target"] for row in rows} == {"wire", "framing", "udp", "swarm", "moshpit", "compressed", "stragglers",
                                                   "profile", "trace", "lowcomm", "control"}
    for row in rows:
        assert row["findings"] == 0 and row["inputs"] > 0 and row["coverage"] > 0, row
