"""Device model: per-node slow-down, stragglers and noise, merged key by key, drawn deterministically."""

from __future__ import annotations

import math
import statistics
import textwrap

import pytest

from squall.profiles import DeviceSpec, Profile, ProfileError, parse_profile
from squall.training.device import DeviceModel

HEAD = "name: t\ndescription: a test profile\n"


def make(body: str) -> Profile:
    return parse_profile(HEAD + textwrap.dedent(body), source="t.yaml")


def model(spec: DeviceSpec) -> DeviceModel:
    """What the training loop draws from the harness's device spec (the draws are defined there only)."""
    return DeviceModel.from_config(spec.to_dict(), node=spec.node)


DEVICES = make(
    """
    devices:
      seed: 9
      default:
        step_time: 50ms
        straggler: {probability: 5%, factor: 4}
        noise: {sigma: 0.1}
      nodes:
        - {nodes: last, slowdown: 3x}
        - {nodes: 0, straggler: {probability: 0%, factor: 1}, noise: 0, step_time: 20ms}
    """
)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        pytest.param(1, DeviceSpec(1, 9, 0.05, 1.0, 0.05, 4.0, 0.1), id="default"),
        pytest.param(0, DeviceSpec(0, 9, 0.02, 1.0, 0.0, 1.0, 0.0), id="override-key-by-key"),
        pytest.param(3, DeviceSpec(3, 9, 0.05, 3.0, 0.05, 4.0, 0.1), id="slowdown-keeps-default-straggler"),
    ],
)
def test_device_merge(node: int, expected: DeviceSpec) -> None:
    assert DEVICES.device(node, 4) == expected


def test_no_devices_section_means_plain_devices() -> None:
    spec = make("").device(2, 4)
    assert spec == DeviceSpec(node=2, seed=0)
    assert [model(spec).step_factor(step) for step in range(5)] == [1.0] * 5
    assert model(spec).mean_factor == 1.0


def test_step_factor_is_deterministic_per_node_and_step() -> None:
    spec = DEVICES.device(1, 4)
    assert [model(spec).step_factor(s) for s in range(50)] == [
        model(DEVICES.device(1, 4)).step_factor(s) for s in range(50)
    ]
    assert model(spec).step_factor(1) != model(spec).step_factor(2)
    assert model(spec).step_factor(1) != model(DEVICES.device(2, 4)).step_factor(1)  # nodes draw independently


def test_seed_changes_the_draws() -> None:
    other = make(
        "devices: {seed: 10, default: {straggler: {probability: 5%, factor: 4}, noise: 0.1}}"
    ).device(1, 4)
    assert [model(other).step_factor(s) for s in range(20)] != [
        model(DEVICES.device(1, 4)).step_factor(s) for s in range(20)
    ]


def test_constant_slowdown_without_randomness() -> None:
    spec = make("devices: {nodes: [{nodes: 3, slowdown: 2.5}]}").device(3, 4)
    assert {model(spec).step_factor(s) for s in range(100)} == {2.5}


def test_straggler_frequency_and_mean() -> None:
    """20000 steps with p = 5%: expected 1000 stragglers, s.d. ~31; 850..1150 is ~5 s.d."""
    spec = make("devices: {default: {straggler: {probability: 5%, factor: 4}}}").device(0, 2)
    device = model(spec)
    factors = [device.step_factor(s) for s in range(20_000)]
    assert set(factors) == {1.0, 4.0}
    assert 850 <= factors.count(4.0) <= 1150
    assert model(spec).mean_factor == pytest.approx(1 + 0.05 * 3)


def test_lognormal_noise() -> None:
    """Median 1, log-s.d. sigma; 20000 draws estimate sigma within a few percent."""
    spec = make("devices: {default: {noise: 0.2}}").device(0, 2)
    device = model(spec)
    logs = [math.log(device.step_factor(s)) for s in range(20_000)]
    assert abs(statistics.fmean(logs)) < 0.01
    assert statistics.pstdev(logs) == pytest.approx(0.2, rel=0.05)
    assert model(spec).mean_factor == pytest.approx(math.exp(0.02))


def test_to_dict() -> None:
    assert DEVICES.device(3, 4).to_dict()["slowdown"] == 3.0


# -- micro-batch noise (DropCompute's per-micro-batch injection) -----------------------------------

MICRO = make(
    """
    devices:
      seed: 4
      default:
        step_time: 160ms
        microbatch_noise: {distribution: dropcompute-lognormal, delay_factor: 2}
      nodes:
        - {nodes: 0, microbatch_noise: none}
        - {nodes: 1, microbatch_noise: dropcompute-lognormal}
        - {nodes: 2, slowdown: 2}
    """
)


@pytest.mark.parametrize(
    ("node", "noise", "delay_factor"),
    [
        pytest.param(3, "dropcompute-lognormal", 2.0, id="default"),
        pytest.param(0, None, 0.0, id="switched-off"),
        pytest.param(1, "dropcompute-lognormal", 1.0, id="short-form-means-delay-1"),
        pytest.param(2, "dropcompute-lognormal", 2.0, id="other-key-keeps-default"),
    ],
)
def test_microbatch_noise_merge(node: int, noise: str | None, delay_factor: float) -> None:
    spec = MICRO.device(node, 4)
    assert (spec.microbatch_noise, spec.microbatch_delay_factor) == (noise, delay_factor)
    assert spec.to_dict()["microbatch_noise"] == noise
    assert model(spec).microbatch_varies == (noise is not None)


def test_microbatch_noise_reaches_the_model() -> None:
    """The spec's settings drive DeviceModel's draws: mean 1 + 0.5 d, and the right nodes vary."""
    devices = [model(MICRO.device(node, 4)) for node in range(4)]
    assert [d.mean_microbatch_factor for d in devices] == pytest.approx([1.0, 1.5, 2 * 2.0, 2.0])
    assert {devices[0].microbatch_factor(5, i) for i in range(8)} == {1.0}
    assert len({devices[3].microbatch_factor(5, i) for i in range(8)}) > 1
    assert [d.mean_factor for d in devices] == pytest.approx([1.0, 1.0, 2.0, 1.0])  # whole steps: no noise


def test_microbatch_constants_match_the_device_model() -> None:
    """The profiles layer may not import protocols/, so it repeats the names and the bound: keep them equal."""
    from squall.profiles import devices
    from squall.training import device

    assert devices.MICROBATCH_DISTRIBUTIONS == device.MICROBATCH_NOISES
    assert devices.MAX_DELAY_FACTOR == device.MAX_DELAY_FACTOR
    edge = make(
        f"devices: {{default: {{microbatch_noise: {{distribution: dropcompute-lognormal,"
        f" delay_factor: {devices.MAX_DELAY_FACTOR:g}}}}}}}"
    ).device(0, 2)
    assert model(edge).microbatch_delay_factor == devices.MAX_DELAY_FACTOR  # the model accepts the bound


@pytest.mark.parametrize(
    ("body", "key", "value", "allowed"),
    [
        pytest.param(
            "{distribution: lognormal}",
            "devices.default.microbatch_noise.distribution",
            "lognormal",
            "dropcompute-lognormal or none",
            id="unknown-distribution",
        ),
        pytest.param(
            "paper", "devices.default.microbatch_noise", "paper", "dropcompute-lognormal or none", id="unknown-short"
        ),
        pytest.param("3", "devices.default.microbatch_noise", 3, "dropcompute-lognormal", id="number"),
        pytest.param(
            "{delay_factor: 1}",
            "devices.default.microbatch_noise.distribution",
            None,
            "dropcompute-lognormal",
            id="missing-distribution",
        ),
        pytest.param(
            "{distribution: dropcompute-lognormal, delay_factor: 101}",
            "devices.default.microbatch_noise.delay_factor",
            101,
            "from 0 to 100",
            id="delay-too-large",
        ),
        pytest.param(
            "{distribution: dropcompute-lognormal, delay_factor: -0.5}",
            "devices.default.microbatch_noise.delay_factor",
            -0.5,
            "from 0 to 100",
            id="negative-delay",
        ),
        pytest.param(
            "{distribution: dropcompute-lognormal, delay_factor: 2x}",
            "devices.default.microbatch_noise.delay_factor",
            "2x",
            "a number from 0 to 100",
            id="delay-with-unit",
        ),
        pytest.param(
            "{distribution: dropcompute-lognormal, delay_factor: true}",
            "devices.default.microbatch_noise.delay_factor",
            True,
            "a number",
            id="delay-bool",
        ),
        pytest.param(
            "{distribution: none, delay_factor: 2}",
            "devices.default.microbatch_noise.delay_factor",
            2,
            "0 or left out",
            id="delay-without-distribution",
        ),
        pytest.param(
            "{distribution: dropcompute-lognormal, sigma: 1}",
            "devices.default.microbatch_noise.sigma",
            "sigma",
            "keys distribution, delay_factor",
            id="unknown-key",
        ),
    ],
)
def test_microbatch_noise_errors(body: str, key: str, value: object, allowed: str) -> None:
    """Each message names the file, the key path, the value as written and what is allowed."""
    with pytest.raises(ProfileError) as info:
        make(f"devices: {{default: {{microbatch_noise: {body}}}}}")
    error = info.value
    assert (error.file, error.key) == ("t.yaml", key)
    if value is not None:
        assert error.value == value and type(error.value) is type(value)
    assert allowed in error.allowed
    assert str(error).startswith(f"t.yaml: {key}: ")


def test_microbatch_noise_on_a_node_entry_alone_is_a_setting() -> None:
    """A nodes entry with only microbatch_noise sets something (the 'sets nothing' check knows the key)."""
    spec = make("devices: {nodes: [{nodes: last, microbatch_noise: dropcompute-lognormal}]}").device(1, 2)
    assert spec.microbatch_noise == "dropcompute-lognormal" and spec.microbatch_delay_factor == 1.0
    with pytest.raises(ProfileError, match="sets nothing"):
        make("devices: {nodes: [{nodes: last}]}")


def test_profiles_show_prints_the_micro_batch_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from squall.cli.profiles import main

    assert main(["profiles", "show", "stragglers-lognormal", "--workers", "2"]) == 0
    lines = capsys.readouterr().out.split("devices:\n", 1)[1].splitlines()
    assert lines[0].split() == [
        "NODE", "STEP", "TIME", "SLOWDOWN", "STRAGGLER", "NOISE", "SIGMA", "MB", "NOISE", "MEAN", "FACTOR",
        "MEAN", "MB", "FACTOR",
    ]  # fmt: skip
    assert lines[1].split() == ["0", "160ms", "1x", "-", "-", "dropcompute-lognormal", "x1", "1.000", "1.500"]
