"""Small parts of squall.training: optimiser, schedules, device model, fingerprint, vote, job config."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from squall.profiles.model import DeviceSpec
from squall.training.config import RunConfig
from squall.training.device import DeviceModel
from squall.training.fingerprint import MAX_PROJECTED, Projector, param_hash
from squall.training.optim import LrSchedule, Sgd, SgdConfig
from squall.training.options import option_keys
from squall.training.vote import TransportVote
from squall.transport import inproc_mesh


def test_sgd_matches_torch_optim_sgd() -> None:
    torch.manual_seed(0)
    for cfg in (SgdConfig(), SgdConfig(momentum=0.9), SgdConfig(momentum=0.9, nesterov=True, weight_decay=0.01)):
        ours = Sgd(cfg)
        x = torch.randn(50)
        ref = torch.nn.Parameter(x.clone())
        opt = torch.optim.SGD(
            [ref], lr=0.05, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay
        )
        for _ in range(5):
            g = torch.randn(50)
            before = x.clone()
            x = ours.update(x, g, 0.05)
            assert not torch.equal(before, x)
            ref.grad = g.clone()
            opt.step()
        torch.testing.assert_close(x, ref.detach(), rtol=1e-6, atol=1e-7)


def test_sgd_config_validation() -> None:
    with pytest.raises(ValueError):
        SgdConfig(momentum=1.0)
    with pytest.raises(ValueError):
        SgdConfig(nesterov=True)


def test_lr_schedules() -> None:
    const = LrSchedule(0.1, warmup_steps=4)
    assert [const(k) for k in range(6)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    step = LrSchedule(1.0, kind="step", milestones=(10, 20), gamma=0.5)
    assert (step(9), step(10), step(25)) == (1.0, 0.5, 0.25)
    cos = LrSchedule(1.0, kind="cosine", total_steps=100, min_lr=0.1)
    assert cos(0) == 1.0 and cos(50) == pytest.approx(0.55) and cos(100) == pytest.approx(0.1) and cos(500) == 0.1
    assert LrSchedule.from_config(0.3, {"kind": "cosine"}, total_steps=10)(10) == pytest.approx(0.0)
    for bad in ({"kind": "exp"}, {"kinds": "step"}, {"kind": "cosine"}):
        with pytest.raises(ValueError):
            LrSchedule.from_config(0.1, bad)


@pytest.mark.parametrize(
    "fields",
    [
        {"step_time_s": 0.01},
        {"step_time_s": 0.02, "slowdown": 2.0, "straggler_probability": 0.2, "straggler_factor": 5.0},
        {"noise_sigma": 0.3, "straggler_probability": 0.5, "straggler_factor": 2.0},
    ],
)
def test_device_model_draws_exactly_what_the_harness_profile_says(fields: dict[str, float]) -> None:
    spec = DeviceSpec(node=2, seed=17, **fields)  # type: ignore[arg-type]
    model = DeviceModel.from_config(spec.to_dict(), node=0)
    assert model.node == 2
    # Every field of the harness's spec reaches the model unchanged: nothing is dropped on the way.
    assert {name: getattr(model, name) for name in spec.to_dict()} == spec.to_dict()
    assert set(spec.to_dict()) == set(option_keys(DeviceModel))


def test_device_model_compute_time() -> None:
    fixed = DeviceModel(step_time_s=0.01, slowdown=2.0)
    assert fixed.compute_time(0, 0.001) == pytest.approx(0.02) and fixed.padding(0, 0.001) == pytest.approx(0.019)
    assert fixed.padding(0, 0.05) == 0.0  # real compute longer than the model: no padding
    slow = DeviceModel(slowdown=3.0)
    assert slow.padding(0, 0.01) == pytest.approx(0.02)
    assert DeviceModel(slowdown=0.5).padding(0, 0.01) == 0.0  # cannot emulate a faster device
    assert not DeviceModel().emulated and slow.emulated and fixed.emulated
    with pytest.raises(ValueError, match=r"unknown option\(s\)"):
        DeviceModel.from_config({"step_time": 1}, node=0)
    with pytest.raises(ValueError):
        DeviceModel(straggler_factor=0.5)


def test_fingerprint_hash_norm_and_projection() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    p1, p2 = Projector(1000), Projector(1000)
    f = p1.fingerprint(x)
    assert f == p2.fingerprint(x.clone())  # another worker, same params: same everything
    assert len(f.hash) == 16 and f.hash == param_hash(x) and f.norm == pytest.approx(float(x.norm()))
    y = x.clone()
    y[3] = torch.nextafter(y[3], torch.tensor(math.inf))  # one ulp
    assert param_hash(y) != f.hash
    # ||P x - P y|| estimates ||x - y|| (8 rows: within a factor ~2 with overwhelming probability).
    z = x + 0.1 * torch.randn(1000, generator=torch.Generator().manual_seed(2))
    est = math.dist(p1(x), p1(z))
    assert 0.4 * float((x - z).norm()) < est < 2.0 * float((x - z).norm())
    big = Projector(MAX_PROJECTED * 2, span=MAX_PROJECTED + 10)
    assert big.index is not None and int(big.index.max()) < MAX_PROJECTED + 10
    v = torch.zeros(MAX_PROJECTED * 2)
    v[MAX_PROJECTED + 10 :] = 1.0  # beyond the span (ballast): invisible to the projection
    assert big(v) == (0.0,) * 8


def test_transport_vote_is_an_or_seen_by_everyone() -> None:
    async def main() -> list[list[bool]]:
        transports = inproc_mesh(4)
        votes = [TransportVote(t) for t in transports]
        out: list[list[bool]] = []
        for step, flags in enumerate(([False] * 4, [False, False, True, False], [True] * 4)):
            decisions = await asyncio.gather(*(v(step, f) for v, f in zip(votes, flags, strict=True)))
            out.append([d.stop for d in decisions])
        return out

    assert asyncio.run(main()) == [[False] * 4, [True] * 4, [True] * 4]


def test_run_config_defaults_parsing_and_errors() -> None:
    cfg = RunConfig.from_json({}, default_seed=9)
    assert cfg.loop.steps == 100 and cfg.loop.seed == 9 and cfg.algorithm == "allreduce" and cfg.port == 29500
    cfg = RunConfig.from_json(
        {
            "task": "mlp_digits",
            "task_args": {"hidden": 32},
            "sharding": "dirichlet:0.5",
            "ballast_mb": 0.25,
            "algorithm": "local_sgd",
            "algorithm_args": {"period": 4},
            "seconds": 30,
            "lr": 0.2,
            "lr_schedule": {"warmup_steps": 5},
            "momentum": 0.9,
            "batch_size": 16,
            "target": {"accuracy": 0.9},
            "device": {"step_time_s": 0.01},
            "seed": 3,
            "eval_every": 10,
            "metrics_every": 2,
        },
        max_seconds=12.0,
    )
    assert cfg.loop.steps is None and cfg.loop.seconds == 12.0 and cfg.loop.lr(0) == pytest.approx(0.04)
    assert cfg.sgd.momentum == 0.9 and cfg.loop.target is not None and cfg.loop.seed == 3
    task = cfg.build_task()
    assert task.dim == 32 * 64 + 32 + 10 * 32 + 10 + (1 << 16)
    with pytest.raises(ValueError, match=r"unknown option\(s\)"):
        RunConfig.from_json({"stpes": 10})
