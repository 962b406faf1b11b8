"""Every gating claim in claims.yaml, measured on real containers and shaped links (see squall/claims/registry.py).

Claims with ``gate: false`` say in the registry why they cannot gate CI on this host; ``make matrix``
measures and reports them all.
"""

from __future__ import annotations

from typing import Any

import pytest

from squall.claims.registry import evaluate, load_claims

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.parametrize("claim", [c for c in load_claims() if c.gate], ids=lambda c: c.id)
def test_claim(claim: Any, squall_run: Any, squall_check: Any, record_property: Any) -> None:
    result = evaluate(claim, lambda spec, workers: squall_run(spec, workers=workers))
    record_property("squall_claim_paper_figure", claim.paper_figure)
    # The figure measured, also on a pass: a run with --junitxml keeps it (the census's figures).
    record_property("squall_claim_measured", result.verdict.measured)
    record_property("squall_claim_why", result.verdict.why)
    squall_check(result.verdict)
