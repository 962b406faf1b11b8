"""The emulated accelerator and payload: overruns flag an invalid emulation, the device is in every result, and
the payload setting is validated and recorded."""

from __future__ import annotations

import asyncio

import pytest
import torch

from squall.training.algorithms import LocalOnly
from squall.training.config import RunConfig
from squall.training.device import DeviceModel, emulation_valid
from squall.training.loop import train
from squall.training.payload import Payload, parse_count
from squall.training.run import LoopConfig
from squall.training.tasks import make_task


def test_overrun_is_what_real_compute_took_beyond_the_emulated_step() -> None:
    device = DeviceModel(step_time_s=0.1)
    assert device.overrun(0, 0.04) == 0 and device.padding(0, 0.04) == pytest.approx(0.06)
    assert device.overrun(0, 0.25) == pytest.approx(0.15) and device.padding(0, 0.25) == 0
    assert DeviceModel().overrun(0, 5.0) == 0  # no step time: nothing to outlast


def test_a_run_records_its_device_and_how_it_held() -> None:
    task = make_task("quadratic")
    clock = iter([i * 0.01 for i in range(10_000)])  # every clock read advances 10 ms: real compute 10 ms

    async def run(step_time: float) -> dict[str, object]:
        result = await train(task, LocalOnly(), LoopConfig(steps=5, eval_every=5), rank=0, world_size=1,
                             device=DeviceModel(step_time_s=step_time), clock=lambda: next(clock))
        return dict(result.summary()["device"])

    held = asyncio.run(run(0.5))
    assert held["step_time_s"] == 0.5 and held["emulated_compute_s"] == pytest.approx(2.5)
    assert held["overrun_steps"] == 0 and held["valid"] is True
    broken = asyncio.run(run(0.001))
    assert broken["overrun_steps"] == 5 and broken["valid"] is False
    assert emulation_valid(0.009, 1.0) and not emulation_valid(0.011, 1.0)  # 1 % of the steps' time


@pytest.mark.parametrize(("text", "count"), [("124M", 124_000_000), ("1.3B", 1_300_000_000), ("500k", 500_000),
                                             (4096, 4096)])
def test_payload_counts(text: object, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("bad", [{"params": "lots"}, {"params": 0}, {"dtype": "fp8"}, {"size": 1}, "124M", True])
def test_a_bad_payload_names_what_is_allowed(bad: object) -> None:
    with pytest.raises(ValueError, match="payload"):
        RunConfig.from_json({"payload": bad})


def test_payload_padding_and_description() -> None:
    p = Payload.parse({"params": "124M", "dtype": "bf16"})
    assert p.padded_numel(1000, 1_000_000) == 124_000 and p.itemsize == 2
    assert p.describe(1_000_000)["bytes"] == 248_000_000
    with pytest.raises(ValueError, match="smaller than the task"):
        Payload(params=10).padded_numel(5, 100)
    config = RunConfig.from_json({"payload": {"params": "1M"}, "algorithm_args": {"sync_every": 5}})
    assert config.algorithm_options() == {"sync_every": 5, "payload": {"params": "1M"}}
    assert torch.float32 == Payload().torch_dtype and Payload().is_default
