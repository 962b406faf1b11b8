"""The report's protocol table compares each protocol with its profile's best paired by seed: a ratio with its
95 % interval, ``~`` when it is not detectably slower, so noise is never ranked."""

from __future__ import annotations

from squall.report.compare import CellFigures, compare


def _cells(protocol: str, seconds: list[float | None], *, profile: str = "lan") -> list[CellFigures]:
    return [CellFigures(protocol, profile, 4, seed, s, None if s is None else 1e6, 10, 1e6, 0.5, budget_s=20.0)
            for seed, s in enumerate(seconds)]


def test_a_protocol_within_the_noise_of_the_best_is_not_called_slower() -> None:
    c = compare(_cells("ring", [1.00, 1.30, 0.90, 1.20, 1.05]) + _cells("dpsgd", [1.10, 1.00, 1.25, 0.95, 1.15]))
    best = min(("ring", "dpsgd"), key=lambda p: c.seconds[(p, "lan")] or 99)
    other = "dpsgd" if best == "ring" else "ring"
    assert c.versus[(best, "lan")].verdict == "best"
    v = c.versus[(other, "lan")]
    assert v.verdict == "same" and v.ci_low is not None and v.ci_low < 1.0 < v.ci_high  # type: ignore[operator]
    assert v.words().startswith("~ ")


def test_a_protocol_slower_in_every_seed_is_slower_with_its_interval() -> None:
    c = compare(_cells("ring", [1.0, 1.1, 0.9, 1.05]) + _cells("local_sgd", [2.0, 2.3, 1.8, 2.1]))
    v = c.versus[("local_sgd", "lan")]
    assert v.verdict == "slower" and v.ci_low is not None and v.ci_low > 1.5 and v.seeds == 4
    assert v.words() == f"{v.ratio:.2f}x ({v.ci_low:.2f}-{v.ci_high:.2f})"


def test_a_run_that_never_reached_the_target_counts_at_its_budget() -> None:
    c = compare(_cells("ring", [1.0, 1.1, 0.9]) + _cells("lossy", [None, None, None]))
    assert c.versus[("lossy", "lan")].verdict == "slower"  # censored at 20 s against about 1 s: slower


def test_one_seed_gives_a_ratio_and_no_verdict() -> None:
    c = compare(_cells("ring", [1.0]) + _cells("dpsgd", [2.0]))
    assert c.versus[("dpsgd", "lan")].words() == "2.00x (1 seed)"
