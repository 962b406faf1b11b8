"""open_shaper: which backend, and the errors when the choice cannot be honoured."""

from __future__ import annotations

from typing import Any

import pytest

from squall.shaping import select
from squall.shaping.base import BACKENDS, Endpoint, ShapingError
from squall.shaping.capabilities.qdisc_probe import ProbeResult

EPS = [Endpoint(0, "10.0.0.2", "/proc/1/ns/net")]


class Fake:
    def __init__(self, endpoints: list[Endpoint], *, run_id: str) -> None:
        self.endpoints, self.run_id = endpoints, run_id


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import squall.shaping.netem.backend as netem
    import squall.shaping.nfqueue.backend as nfq

    netem_cls = type("NetemFake", (Fake,), {"backend": "netem"})
    nfq_cls = type("NfqFake", (Fake,), {"backend": "nfqueue"})
    monkeypatch.setattr(netem, "NetemShaper", netem_cls)
    monkeypatch.setattr(nfq, "NfqueueShaper", nfq_cls)
    return {"netem": netem_cls, "nfqueue": nfq_cls}


def probe_says(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(select, "netem_probe", lambda: ProbeResult(available, "because the test says so"))


@pytest.mark.parametrize(("available", "chosen"), [(True, "netem"), (False, "nfqueue")])
def test_default_prefers_netem(
    monkeypatch: pytest.MonkeyPatch,
    fakes: dict[str, Any],
    available: bool,
    chosen: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe_says(monkeypatch, available)
    with caplog.at_level("INFO", logger="squall.shaping.select"):
        shaper = select.open_shaper(EPS, run_id="r1")
    assert shaper.backend == chosen
    assert f"shaping backend for run r1: {chosen}" in caplog.text


def test_forced_netem_where_missing_says_why(monkeypatch: pytest.MonkeyPatch, fakes: dict[str, Any]) -> None:
    probe_says(monkeypatch, False)
    with pytest.raises(ShapingError, match="netem backend cannot run here: because the test says so"):
        select.open_shaper(EPS, run_id="r1", backend="netem")


def test_forced_nfqueue_never_probes(monkeypatch: pytest.MonkeyPatch, fakes: dict[str, Any]) -> None:
    monkeypatch.setattr(select, "netem_probe", lambda: pytest.fail("probed"))
    assert select.open_shaper(EPS, run_id="r1", backend="nfqueue").backend == "nfqueue"


def test_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(ShapingError, match=", ".join(BACKENDS)):
        select.open_shaper(EPS, run_id="r1", backend="tbf")
