"""The reduced matrix of CI (matrices/ci.yaml): every protocol x lan, wan-5ms, lossy-1pct on 4 workers,
through the pytest plugin, each cell checked for convergence and bounded drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from squall.checks import Target, converged, drift_bounded
from squall.experiment.matrix import load_matrix_file
from squall.protocols.catalog import PROTOCOLS

CI = load_matrix_file(Path(__file__).resolve().parents[2] / "matrices" / "ci.yaml", known_protocols=PROTOCOLS)
TARGET = Target(*next(iter(CI.run["target"].items())))
#: Max pairwise distance of the parameters' 8-d projections. Synchronous protocols keep workers
#: bit-identical (0); gossip keeps them within a small, shrinking neighbourhood. The logistic
#: regression's parameters have norm ~10-20 at the target, so 3 is loose enough for gossip under
#: 1 % loss and still catches a worker that wanders off (no averaging at all gives ~10).
DRIFT_BOUND = 3.0

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.squall(protocols=list(CI.matrix.protocols), profiles=list(CI.matrix.profiles),
                    workers=list(CI.matrix.workers), **{k: v for k, v in CI.run.items() if k != "target"},
                    target=CI.run["target"])
def test_protocol_converges_with_bounded_drift(squall_trace: Any, squall_check: Any) -> None:
    squall_check(converged(squall_trace, TARGET))
    squall_check(drift_bounded(squall_trace, DRIFT_BOUND))
