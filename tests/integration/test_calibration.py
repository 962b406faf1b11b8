"""``calibrate`` end to end: a real cluster, the default backend, the shipped ``wan-5ms`` profile.

A correct backend fails this with probability <= 1 %: the run's loss checks share a 1 % budget,
the delay and jitter checks are below 1e-6 each, and the rate checks are tolerances.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from squall.calibration.runner import calibrate
from squall.checks.verdict import Validity
from squall.cli import calibrate as cli_calibrate
from squall.shaping import LinkState, Shaper, netem_available
from tests.timing import report_passed

pytestmark = [pytest.mark.docker, pytest.mark.slow]
logger = logging.getLogger(__name__)


def shape_otherwise(monkeypatch: pytest.MonkeyPatch, instead: Callable[[LinkState], LinkState]) -> None:
    """Every shaper opened from now on applies ``instead(state)`` whatever it is asked to apply: a
    backend that shapes wrongly, for calibration to catch."""
    from squall import shaping

    real_open = shaping.open_shaper

    class Otherwise:
        def __init__(self, inner: Shaper) -> None:
            self.inner, self.backend = inner, inner.backend

        def apply(self, state: LinkState) -> None:
            self.inner.apply(instead(state))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    monkeypatch.setattr(shaping, "open_shaper", lambda *a, **kw: Otherwise(real_open(*a, **kw)))


def test_wan_5ms_on_three_workers_passes(docker_client: Any, worker_image: str) -> None:
    report = calibrate("wan-5ms", workers=3)
    logger.info("%s", report.format())
    assert report.backend == ("netem" if netem_available() else "nfqueue")
    report_passed(report)
    assert len(report.rows) == 6 * 4  # delay, jitter, loss and rate on each of the 6 directed links
    assert {r.metric for r in report.rows} == {"delay", "jitter", "loss", "rate"}
    assert report.duration_s < 120
    delays = [r.measured for r in report.rows if r.metric == "delay"]
    assert all(d is not None and 4.5 <= d <= 5.5 for d in delays)


def test_cli_writes_json_and_fails_when_the_links_differ_from_the_profile(
        docker_client: Any, worker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shaper is handed 5 ms and 1 Gbit/s whatever it is asked for; judged against thin-20mbit
    (10 ms, 20 Mbit/s), the delay and the rate must fail and the CLI exit 1."""
    shape_otherwise(monkeypatch, lambda state: LinkState(
        {k: dataclasses.replace(v, delay_us=5000, rate_bps=1_000_000_000) for k, v in state.links.items()},
        {}, state.blocked))
    out = tmp_path / "report.json"
    code = cli_calibrate.main(["calibrate", "--profile", "thin-20mbit", "--workers", "2", "--pairs", "0->1",
                               "--quick", "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 1
    assert data["verdict"] == Validity.FAIL.past == "failed" and data["backend"] in ("netem", "nfqueue")
    by_metric = {row["metric"]: row for row in data["rows"]}
    assert by_metric["delay"]["verdict"] == "failed"  # ~5 ms measured, 10 ms configured
    assert by_metric["rate"]["verdict"] == "failed"  # ~1 Gbit/s measured, 20 Mbit/s configured


def test_calibrating_a_traced_profile_judges_its_segments_by_default(docker_client: Any, worker_image: str,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before, ``squall calibrate`` judged a traced profile's first row only and said nothing of the rest."""
    profile = Path(__file__).parent / "profiles" / "three-steps.yaml"
    out = tmp_path / "report.json"
    code = cli_calibrate.main(["calibrate", "--profile", str(profile), "--workers", "2", "--pairs", "0->1",
                               "--quick", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "three-steps's links change over time" in printed and "every segment of its first 11 s" in printed
    segments = json.loads(out.read_text())["segments"]
    assert [round(s["start_s"]) for s in segments["segments"]] == [0, 3, 6]  # every row of the trace, judged
    assert code in (0, 1)  # the verdict is both judgements'; a busy host may make it unknown, never a crash


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-peer"])
def test_a_shared_uplink_is_judged_by_sending_to_every_peer_at_once(
        docker_client: Any, worker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool) -> None:
    """home-broadband-uk gives every node an 18.4 Mbit/s uplink for all its peers together. Each link
    alone reaches 18.4 Mbit/s either way; only node 0 sending to 1, 2 and 3 at once tells a shared cap
    (18.4 in total) from a shaper that gives each peer its own 18.4 Mbit/s (55 in total)."""
    def per_peer(state: LinkState) -> LinkState:  # each link its sender's uplink as a rate of its own, no shared cap
        caps = state.node_links
        links = {(s, d): dataclasses.replace(v, rate_bps=v.rate_bps or caps[s].uplink_bps)
                 if s in caps and caps[s].uplink_bps else v for (s, d), v in state.links.items()}
        return LinkState(links, {}, state.blocked)

    if not shared:
        shape_otherwise(monkeypatch, per_peer)
    out = tmp_path / "report.json"
    code = cli_calibrate.main(["calibrate", "--profile", "home-broadband-uk", "--workers", "4", "--pairs", "0->1",
                               "--quick", "--json", str(out)])
    rows = {row["metric"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["rate"]["configured"] == pytest.approx(18.4) and rows["rate"]["verdict"] == "passed"
    uplink = rows["uplink"]
    assert uplink["link"] == [0, 0] and uplink["configured"] == pytest.approx(18.4)
    assert uplink["why"].startswith("node 0 to 1, 2, 3 at once")
    if shared:
        assert code == 0 and uplink["verdict"] == "passed", uplink
    else:
        assert code == 1 and uplink["verdict"] == "failed" and uplink["measured"] > 45, uplink
