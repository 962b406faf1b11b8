"""Shipped profiles, loading by name and path, SQUALL_PROFILE_PATH, and the README's examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from squall.profiles import (
    PATH_ENV,
    PROFILE_DIR,
    ChurnKind,
    Distribution,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    parse_profile,
)
from tests.unit.traced_profiles import traced_paths

SHIPPED = [
    "lan",
    "wan-5ms",
    "wan-20ms",
    "wan-50ms-100mbit",
    "geo-2-regions",
    "lossy-1pct",
    "lossy-5pct",
    "lossy-10pct",
    "bursty-loss",
    "thin-20mbit",
    "thin-100mbit",
    "thin-20mbit-5ms",
    "fast-200mbit-1ms",
    "preemptible",
    "flaky-links",
    "stragglers",
    "heterogeneous",
    "one-slow-20ms",
    "stragglers-bimodal",
    "stragglers-lognormal",
    "two-slow-3x",
    "home-broadband-uk",
    "volunteers-behind-nat",
    "azure-8-regions",
    "grid-10mbit-1ms",
    "grid-10mbit-50ms",
    "grid-100mbit-1ms",
    "grid-100mbit-50ms",
    "grid-1gbit-1ms",
    "grid-1gbit-50ms",
]
# Shipped profiles whose links follow a trace: the loader does not read traces yet, so they are
# checked by tests/unit/test_profiles_measured.py (and loaded there under a strict xfail).
TRACED = ["broadband-uplink-uk", "cellular-lte", "diloco-3-continents", "trace-steps-1s"]
SIZES = [2, 4, 8, 16]
MAX_RATE = 1_000_000_000


@pytest.fixture(scope="module")
def shipped() -> dict[str, Profile]:
    return {name: load_profile(name) for name in SHIPPED}


def test_every_shipped_file_is_listed_and_tested() -> None:
    assert sorted(SHIPPED + TRACED) == sorted(path.stem for path in PROFILE_DIR.glob("*.yaml"))
    assert sorted(TRACED) == sorted(path.stem for path in traced_paths())


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_validates(shipped: dict[str, Profile], name: str, n: int) -> None:
    profile = shipped[name]
    assert profile.name == name
    if n < profile.required_workers():  # e.g. one region per eighth of the nodes needs 8 workers
        with pytest.raises(ProfileError, match="needs at least"):
            profile.validate_for(n)
        return
    assert profile.validate_for(n) == []
    links = profile.links(n)
    assert len(links) == n * (n - 1)
    for at in (0.0, *profile.change_times()):
        for (src, _), spec in profile.links(n, at).items():
            rate = spec.rate_bps or profile.node_link(src, n, at).uplink_bps  # a link's rate, or its node's uplink
            assert rate is not None and rate <= MAX_RATE, "keep shipped rates (or uplinks) <= 1gbit"
    assert len(profile.churn_events(n, 600.0)) >= 0
    assert [profile.device(i, n).node for i in range(n)] == list(range(n))


@pytest.mark.parametrize(
    ("name", "delay_us", "rate_bps", "loss"),
    [
        ("lan", 100, 1_000_000_000, 0.0),
        ("wan-5ms", 5_000, 1_000_000_000, 0.0),
        ("wan-20ms", 20_000, 1_000_000_000, 0.0),
        ("wan-50ms-100mbit", 50_000, 100_000_000, 0.0),
        ("lossy-1pct", 5_000, 1_000_000_000, 0.01),
        ("lossy-5pct", 5_000, 1_000_000_000, 0.05),
        ("lossy-10pct", 5_000, 1_000_000_000, 0.1),
        ("thin-20mbit", 10_000, 20_000_000, 0.0),
        ("thin-100mbit", 5_000, 100_000_000, 0.0),
        ("thin-20mbit-5ms", 5_000, 20_000_000, 0.0),
        ("fast-200mbit-1ms", 1_000, 200_000_000, 0.0),
    ],
)
def test_uniform_profiles(
    shipped: dict[str, Profile], name: str, delay_us: int, rate_bps: int, loss: float
) -> None:
    for spec in shipped[name].links(4).values():
        assert (spec.delay_us, spec.rate_bps, spec.loss.probability) == (delay_us, rate_bps, loss)


def test_lan_is_sub_millisecond_with_normal_jitter(shipped: dict[str, Profile]) -> None:
    spec = shipped["lan"].link(0, 1, 2)
    assert 100 <= spec.delay_us <= 200
    assert spec.jitter.distribution is Distribution.NORMAL and spec.jitter.amount_us < spec.delay_us


def test_geo_two_regions(shipped: dict[str, Profile]) -> None:
    profile = shipped["geo-2-regions"]
    for (src, dst), spec in profile.links(8).items():
        across = (src < 4) != (dst < 4)
        assert spec.delay_us == (40_000 if across else 1_000)
        assert spec.rate_bps == (100_000_000 if across else 1_000_000_000)


def test_bursty_loss(shipped: dict[str, Profile]) -> None:
    loss = shipped["bursty-loss"].link(0, 1, 2).loss
    assert loss.gemodel is not None and loss.probability == 0
    assert loss.mean == pytest.approx(0.5 / 20.5)


def test_preemptible(shipped: dict[str, Profile]) -> None:
    events = shipped["preemptible"].churn_events(8, 1200.0)
    assert events == shipped["preemptible"].churn_events(8, 1200.0)
    assert {e.kind for e in events} == {ChurnKind.KILL, ChurnKind.RESTART}
    assert all(0 not in e.nodes for e in events)
    assert all(e.at_s >= 10.0 for e in events)
    down = 0
    for event in events:
        down += 1 if event.kind is ChurnKind.KILL else -1
        assert 0 <= down <= 1


def test_flaky_links(shipped: dict[str, Profile]) -> None:
    events = shipped["flaky-links"].churn_events(4, 600.0)
    kinds = {e.kind for e in events}
    assert {ChurnKind.LINK_DOWN, ChurnKind.LINK_UP, ChurnKind.PARTITION, ChurnKind.HEAL} <= kinds
    assert events[0].at_s <= 20.0


def test_stragglers(shipped: dict[str, Profile]) -> None:
    profile = shipped["stragglers"]
    last = profile.device(7, 8)
    assert last.slowdown == 3.0 and profile.device(0, 8).slowdown == 1.0
    assert last.straggler_probability == pytest.approx(0.05) and last.straggler_factor == 4.0
    assert last.step_time_s == pytest.approx(0.05)


def test_stragglers_bimodal(shipped: dict[str, Profile]) -> None:
    """DropCompute's bimodal setting: 8 micro-batches of 20 ms, 4x slower with 10 % each step."""
    profile = shipped["stragglers-bimodal"]
    for spec in profile.links(8).values():
        assert (spec.delay_us, spec.rate_bps) == (10_000, 100_000_000)
    devices = {profile.device(i, 8) for i in range(8)} - {profile.device(0, 8)}
    first = profile.device(0, 8)
    assert all(d.to_dict() | {"node": 0} == first.to_dict() for d in devices)  # every worker alike
    assert first.step_time_s == pytest.approx(0.16)
    assert (first.straggler_probability, first.straggler_factor) == (pytest.approx(0.1), 4.0)


def test_stragglers_lognormal(shipped: dict[str, Profile]) -> None:
    """DropCompute's injected noise: every micro-batch of every worker draws the paper's multiplier."""
    profile = shipped["stragglers-lognormal"]
    for spec in profile.links(8).values():
        assert (spec.delay_us, spec.rate_bps) == (10_000, 100_000_000)
    for node in range(8):
        device = profile.device(node, 8)
        assert device.step_time_s == pytest.approx(0.16) and device.straggler_probability == 0
        assert (device.microbatch_noise, device.microbatch_delay_factor) == ("dropcompute-lognormal", 1.0)


def test_heterogeneous(shipped: dict[str, Profile]) -> None:
    profile = shipped["heterogeneous"]
    n = 8
    assert profile.link(1, 2, n).rate_bps == 50_000_000  # odd egress
    assert profile.link(2, 1, n).rate_bps == 200_000_000  # odd ingress
    assert profile.link(0, 7, n).delay_us == 15_000 and profile.link(7, 0, n).delay_us == 25_000  # asymmetric
    assert profile.link(0, 2, n, at=61.0).loss.probability == 0.01
    assert profile.link(0, 2, n, at=121.0).loss.probability == 0.0
    assert profile.node_link(3, n).uplink_bps == 100_000_000
    assert {profile.device(i, n).slowdown for i in range(n)} == {0.8, 1.0, 1.5}


def test_list_profiles_describes_each(shipped: dict[str, Profile]) -> None:
    infos = {info.name: info for info in list_profiles()}
    assert set(SHIPPED) <= set(infos)
    for name in SHIPPED:
        assert infos[name].description == shipped[name].description
        assert infos[name].path == PROFILE_DIR / f"{name}.yaml"


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ndescription: d\nlinks: {default: {delay: 3ms}}\n")
    assert load_profile(path).link(0, 1, 2).delay_us == 3_000
    assert load_profile(str(path)).source == str(path)


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("no-such-profile")
    assert info.value.file == "no-such-profile"
    assert "wan-5ms" in info.value.allowed


def test_missing_file() -> None:
    with pytest.raises(ProfileError, match="no such file"):
        load_profile("/nonexistent/x.yaml")


def test_profile_path_env_adds_and_shadows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "extra.yaml").write_text("name: extra\ndescription: from the env path\n")
    (tmp_path / "lan.yaml").write_text("name: lan\ndescription: my own lan\nlinks: {default: {delay: 1ms}}\n")
    monkeypatch.setenv(PATH_ENV, f"{tmp_path}:/nonexistent")
    assert load_profile("extra").description == "from the env path"
    assert load_profile("lan").link(0, 1, 2).delay_us == 1_000
    infos = {info.name: info for info in list_profiles()}
    assert infos["lan"].description == "my own lan" and "extra" in infos


def test_a_broken_file_does_not_break_the_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.yaml").write_text("name: [\n")
    monkeypatch.setenv(PATH_ENV, str(tmp_path))
    infos = {info.name: info for info in list_profiles()}
    assert infos["broken"].description.startswith("(unreadable")
    with pytest.raises(ProfileError) as info:
        load_profile("broken")
    assert info.value.file == str(tmp_path / "broken.yaml")


def test_readme_examples_parse_and_validate() -> None:
    """The README's examples of regions/links, phases, churn and devices form one valid profile."""
    readme = (PROFILE_DIR / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL)
    wanted = [b for b in blocks if b.startswith(("regions:", "phases:", "churn:", "devices:"))]
    assert [b.split(":")[0] for b in wanted] == ["regions", "phases", "churn", "devices"]
    profile = parse_profile("name: readme\ndescription: d\n" + "".join(wanted), source="README.md")
    for n in (4, 8):
        profile.validate_for(n)
        assert profile.churn_events(n, 600.0)
    assert profile.link(1, 0, 4).delay_us == 30_000  # the asymmetric pair of the example
