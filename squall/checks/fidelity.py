"""fidelity: the emulated network did what the profile said (from calibration verdicts per link)."""

from __future__ import annotations

from collections.abc import Sequence

from squall.checks.verdict import Verdict, safe, unknown


@safe("fidelity")
def fidelity(links: Sequence[Verdict], *, min_links: int = 1) -> Verdict:
    """Pass when every per-link calibration verdict passed; any unknown makes the whole unknown."""
    expected = "every calibrated link within tolerance"
    if len(links) < min_links:
        return unknown("fidelity", expected, f"{len(links)} link verdicts, need >= {min_links}")
    failed = [v for v in links if v.passed is False]
    undecided = [v for v in links if v.passed is None]
    measured = f"{len(links) - len(failed) - len(undecided)}/{len(links)} within tolerance"
    if failed:
        return Verdict("fidelity", False, measured, expected, "; ".join(v.line() for v in failed[:5]))
    if undecided:
        return unknown("fidelity", expected, "; ".join(v.line() for v in undecided[:5]))
    return Verdict("fidelity", True, measured, expected, "all links conform")
