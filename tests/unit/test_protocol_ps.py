"""Sharded parameter server: pure layout and cost, and synchronous steps over the in-process transport."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from squall.collectives import LinkModel, run_inproc
from squall.protocols.ps import PSLayout, ServerShard, SGDConfig, ps_step, ps_time
from squall.transport import Transport


@given(n=st.integers(1, 12), servers=st.integers(1, 12), dedicated=st.booleans(), numel=st.integers(0, 1000))
def test_layout_roles_and_shards(n: int, servers: int, dedicated: bool, numel: int) -> None:
    if servers > n or (dedicated and servers == n):
        with pytest.raises(ValueError):
            PSLayout(n, servers, dedicated)
        return
    layout = PSLayout(n, servers, dedicated)
    assert list(layout.server_ranks) == list(range(servers))
    assert layout.num_workers == (n - servers if dedicated else n)
    assert all(layout.is_server(r) or layout.is_worker(r) for r in range(n))
    covered = [i for s in layout.server_ranks for i in range(*layout.shard_range(s, numel))]
    assert covered == list(range(numel))


def test_cost_model_server_nic_is_the_bottleneck() -> None:
    link = LinkModel(alpha=1e-3, bandwidth=1e8)
    s = 4e6
    # one dedicated server, 8 workers: the server moves 8 S each way
    assert ps_time(PSLayout(9, 1, dedicated=True), s, link) == pytest.approx(2e-3 + 2 * 8 * s / 1e8)
    # n co-located shards: each rank moves (n-1) S/n as server plus (n-1) S/n as worker, each way
    n = 8
    assert ps_time(PSLayout(n, n), s, link) == pytest.approx(2e-3 + 4 * (n - 1) / n * s / 1e8)


def run_ps(
    layout: PSLayout, params: torch.Tensor, grads: list[list[torch.Tensor]], config: SGDConfig
) -> list[list[torch.Tensor | None]]:
    """Run ``len(grads)`` steps; ``grads[k][r]`` is rank r's gradient at step k (ignored on dedicated servers)."""

    async def rank(t: Transport) -> list[torch.Tensor | None]:
        server = ServerShard.for_rank(layout, t.rank, params, config)
        out = []
        for k, step_grads in enumerate(grads):
            grad = step_grads[t.rank] if layout.is_worker(t.rank) else None
            out.append(await ps_step(t, layout, grad, round=k, server=server))
        return out

    return run_inproc(layout.world_size, rank)


@pytest.mark.parametrize(
    ("n", "servers", "dedicated"), [(1, 1, False), (4, 1, False), (5, 2, False), (5, 5, False), (5, 2, True)]
)
def test_synchronous_step_equals_sgd_on_the_mean_gradient(n: int, servers: int, dedicated: bool) -> None:
    layout = PSLayout(n, servers, dedicated)
    gen = torch.Generator().manual_seed(n + servers)
    params = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    steps = 4
    grads = [[torch.randn(3, 7, generator=gen, dtype=torch.float64) for _ in range(n)] for _ in range(steps)]
    config = SGDConfig(lr=0.1, momentum=0.9, weight_decay=0.01)
    results = run_ps(layout, params, grads, config)

    reference = params.clone().requires_grad_(False)
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9, weight_decay=0.01)
    for k in range(steps):
        mean = torch.stack([grads[k][w] for w in layout.worker_ranks]).sum(dim=0) / layout.num_workers
        reference.grad = mean
        optimizer.step()
        for r in range(n):
            got = results[r][k]
            if layout.is_worker(r):
                assert got is not None and got.shape == (3, 7)
                assert torch.allclose(got, reference, rtol=0, atol=1e-12), f"rank {r} step {k}"
            else:
                assert got is None


def test_plain_sgd_step_is_exact() -> None:
    layout = PSLayout(4, 2)
    params = torch.arange(10, dtype=torch.float64)
    grads = [[torch.full((10,), float(2 * r)).double() for r in range(4)]]
    results = run_ps(layout, params, grads, SGDConfig(lr=0.5))
    for r in range(4):
        got = results[r][0]
        assert got is not None and torch.equal(got, params - 0.5 * 3.0)  # mean gradient (0+2+4+6)/4 = 3


def test_roles_are_checked() -> None:
    layout = PSLayout(3, 1)
    with pytest.raises(ValueError, match="server shard"):
        run_inproc(3, lambda t: ps_step(t, layout, torch.ones(2), round=0, server=None))
    with pytest.raises(ValueError, match="lr"):
        SGDConfig(lr=0)
