"""Ring and butterfly all-reduce on the in-process transport (and once over TCP loopback).

Exactness. Inputs are integer-valued float64 in [-2^20, 2^20]: any partial sum of at most 9 of
them is an integer below 2^24 < 2^53, so every addition is exact whatever the order, and the
result must equal the reference sum bit for bit.

float32 tolerance. Each output element is the sum of ``n`` float32 inputs computed by ``n - 1``
rounded additions (in ring or tree order). With unit roundoff ``u = eps32 / 2`` the classical
bound is ``|s_hat - s| <= gamma_(n-1) sum_i |x_i|`` with ``gamma_k = k u / (1 - k u)``, which for
``n <= 9`` is below ``(n - 1) eps32 sum_i |x_i|``; that is the tolerance, elementwise, against a
float64 reference. ``mean`` adds one rounded division: ``(n - 1) eps32 sum|x| / n + eps32 |mean|``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from squall.calibration.stalls import StallPolicy
from squall.collectives import (
    CollectiveError,
    butterfly_allreduce,
    ring_allreduce,
    run_inproc,
    run_ranks,
)
from squall.collectives.schedule import FoldPlan
from squall.transport import Transport, tcp_mesh
from tests.timing import retrying

EPS32 = torch.finfo(torch.float32).eps
HEADER_AND_DESCRIPTOR = 48 + 16  # bytes per 1-d tensor message on the wire besides the data

AllReduce = Callable[..., Awaitable[torch.Tensor]]
VARIANTS: dict[str, tuple[AllReduce, dict[str, Any]]] = {
    "ring": (ring_allreduce, {}),
    "halving_doubling": (butterfly_allreduce, {"algorithm": "halving_doubling"}),
    "doubling": (butterfly_allreduce, {"algorithm": "doubling"}),
    "auto": (butterfly_allreduce, {"algorithm": "auto"}),
}
PRIMES = [2, 3, 5, 7, 11, 13, 17, 31, 97, 257, 1009, 4099]


def allreduce_all(variant: str, inputs: list[torch.Tensor], **kw: Any) -> list[torch.Tensor]:
    fn, extra = VARIANTS[variant]
    return run_inproc(len(inputs), lambda t: fn(t, inputs[t.rank], round=7, **extra, **kw))


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(n, size, chunk_bytes, seed): sizes around n, primes, and random ones."""
    n = draw(st.integers(2, 9))
    special = st.sampled_from([1, max(n - 1, 1), n, n + 1, *PRIMES])
    size = draw(st.one_of(special, st.integers(1, 6000)))
    chunk_bytes = draw(st.sampled_from([512, 4096, 1 << 20]))
    return n, size, chunk_bytes, draw(st.integers(0, 2**31 - 1))


def integer_inputs(n: int, size: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-(2**20), 2**20, (size,), generator=gen).double() for _ in range(n)]


@pytest.mark.parametrize("variant", ["ring", "halving_doubling", "doubling"])
@settings(max_examples=25, deadline=None)
@given(case=cases())
def test_float64_sum_is_exact_and_identical_on_every_rank(variant: str, case: tuple[int, int, int, int]) -> None:
    n, size, chunk_bytes, seed = case
    inputs = integer_inputs(n, size, seed)
    expected = torch.stack(inputs).sum(dim=0)
    results = allreduce_all(variant, inputs, chunk_bytes=chunk_bytes)
    for rank, result in enumerate(results):
        assert torch.equal(result, expected), f"rank {rank}: {variant} n={n} size={size}"


@pytest.mark.parametrize("variant", ["ring", "halving_doubling", "doubling"])
@settings(max_examples=20, deadline=None)
@given(case=cases(), op=st.sampled_from(["sum", "mean"]))
@example(case=(9, 1_000_003, 1 << 20, 1), op="sum")
def test_float32_within_the_derived_bound_and_bit_identical(
    variant: str, case: tuple[int, int, int, int], op: str
) -> None:
    n, size, chunk_bytes, seed = case
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(size, generator=gen) * 10 ** torch.randint(-3, 4, (size,), generator=gen) for _ in range(n)]
    stacked = torch.stack(inputs).double()
    exact = stacked.sum(dim=0)
    bound = (n - 1) * EPS32 * stacked.abs().sum(dim=0)
    if op == "mean":
        exact, bound = exact / n, bound / n + EPS32 * (exact / n).abs()
    results = allreduce_all(variant, inputs, op=op, chunk_bytes=chunk_bytes)
    error = (results[0].double() - exact).abs()
    worst = int(torch.argmax(error - bound))
    assert bool((error <= bound).all()), f"element {worst}: error {error[worst]} > bound {bound[worst]}"
    for rank, result in enumerate(results[1:], start=1):
        assert result.dtype == torch.float32 and torch.equal(result, results[0]), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_million_elements(variant: str) -> None:
    inputs = integer_inputs(5, 1_000_003, seed=3)
    results = allreduce_all(variant, inputs)
    expected = torch.stack(inputs).sum(dim=0)
    assert all(torch.equal(r, expected) for r in results)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_shapes_dtypes_ops_and_trivial_cases(variant: str, n: int) -> None:
    x = [torch.arange(12, dtype=torch.float64).reshape(3, 4) * (r + 1) for r in range(n)]
    mean = allreduce_all(variant, x, op="mean")
    assert all(m.shape == (3, 4) and torch.equal(m, torch.stack(x).mean(dim=0)) for m in mean)
    ints = [torch.tensor([r, -r, 5], dtype=torch.int64) for r in range(n)]
    assert all(torch.equal(s, torch.stack(ints).sum(dim=0)) for s in allreduce_all(variant, ints))
    assert all(torch.equal(s, torch.stack(ints).max(dim=0).values) for s in allreduce_all(variant, ints, op="max"))
    assert all(torch.equal(s, torch.stack(ints).min(dim=0).values) for s in allreduce_all(variant, ints, op="min"))
    empty = allreduce_all(variant, [torch.zeros(0, 2) for _ in range(n)])
    assert all(e.shape == (0, 2) for e in empty)
    scalar = allreduce_all(variant, [torch.tensor(float(r)) for r in range(n)])
    assert all(s.shape == () and float(s) == n * (n - 1) / 2 for s in scalar)


def test_inputs_are_left_untouched_and_results_are_fresh() -> None:
    x = [torch.ones(10) * r for r in range(4)]
    before = [t.clone() for t in x]
    for variant in VARIANTS:
        out = allreduce_all(variant, x)
        assert all(torch.equal(a, b) for a, b in zip(x, before, strict=True))
        assert all(o.data_ptr() != t.data_ptr() for o, t in zip(out, x, strict=True))


def data_bytes_sent(variant: str, n: int, size: int, chunk_bytes: int) -> int:
    """Tensor bytes all ranks sent, headers and descriptors subtracted."""
    fn, extra = VARIANTS[variant]
    x = torch.ones(size, dtype=torch.float64)

    async def one(t: Transport) -> int:
        await fn(t, x, round=0, chunk_bytes=chunk_bytes, **extra)
        total = t.total_counters()
        return total.bytes_sent - HEADER_AND_DESCRIPTOR * total.messages_sent

    return sum(run_inproc(n, one))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8])
def test_traffic_equals_the_cost_model(n: int) -> None:
    size, s = 1000, 8000  # elements, bytes
    p = FoldPlan.of(n).core
    fold = 2 * (n - p) * s
    assert data_bytes_sent("ring", n, size, 256) == 2 * (n - 1) * s
    assert data_bytes_sent("halving_doubling", n, size, 256) == 2 * (p - 1) * s + fold
    assert data_bytes_sent("doubling", n, size, 256) == p * (p.bit_length() - 1) * s + fold


def test_mismatched_sizes_raise_a_collective_error() -> None:
    with pytest.raises(CollectiveError, match="expected"):
        run_inproc(3, lambda t: ring_allreduce(t, torch.ones(10 + t.rank), round=0), default_timeout=2.0)


def test_unknown_op_and_integer_mean_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown op"):
        run_inproc(2, lambda t: ring_allreduce(t, torch.ones(3), round=0, op="prod"))
    with pytest.raises(ValueError, match="floating-point"):
        run_inproc(2, lambda t: butterfly_allreduce(t, torch.ones(3, dtype=torch.int32), round=0, op="mean"))
    with pytest.raises(ValueError, match="algorithm"):
        run_inproc(2, lambda t: butterfly_allreduce(t, torch.ones(3), round=0, algorithm="tree"))  # type: ignore[arg-type]


def test_consecutive_rounds_do_not_mix_under_random_latency() -> None:
    async def many(t: Transport) -> list[torch.Tensor]:
        out = []
        for k in range(5):
            x = torch.full((37,), float(t.rank + 10 * k))
            out.append(await ring_allreduce(t, x, round=k, chunk_bytes=64))
            out.append(await butterfly_allreduce(t, x, round=k, chunk_bytes=64))
        return out

    results = run_inproc(5, many, latency=0.0005)
    for rank_results in results:
        for i, r in enumerate(rank_results):
            k = i // 2
            assert torch.equal(r, torch.full((37,), float(sum(range(5)) + 50 * k)))


@pytest.mark.parametrize("variant", ["ring", "halving_doubling", "doubling"])
def test_over_tcp_loopback(variant: str) -> None:
    fn, extra = VARIANTS[variant]
    inputs = integer_inputs(5, 300_001, seed=11)
    expected = torch.stack(inputs).sum(dim=0)

    async def main() -> tuple[list[torch.Tensor], float]:
        mesh = await tcp_mesh(5, default_timeout=20.0, connect_timeout=5.0)
        try:
            start = time.perf_counter()
            out = await run_ranks(mesh, lambda t: fn(t, inputs[t.rank], round=1, chunk_bytes=1 << 18, **extra))
            return out, time.perf_counter() - start
        finally:
            await asyncio.gather(*(t.close() for t in mesh))

    results, _ = asyncio.run(main())
    assert all(torch.equal(r, expected) for r in results)


#: Measured time may exceed the alpha-beta model by this factor (event-loop and copy overhead on a busy machine).
TIMING_TOLERANCE = 2.0


@pytest.mark.parametrize(
    ("variant", "chain", "model"),
    # n = 5: p = 4 and one extra rank. chain: hops every schedule must wait for in sequence; model: the cost
    # model's alpha count (the fold's first hop may overlap the core's first step, so chain <= measured <= model).
    [("ring", 8, 8), ("halving_doubling", 4 + 1, 4 + 2), ("doubling", 2 + 1, 2 + 2)],
)
def test_latency_term_matches_the_cost_model(variant: str, chain: int, model: int, stall_policy: StallPolicy) -> None:
    """With a pure per-message latency alpha the time is the number of sequential hops times alpha."""
    alpha = 0.02
    fn, extra = VARIANTS[variant]
    x = torch.ones(4000)

    async def timed(t: Transport) -> float:
        start = time.perf_counter()
        await fn(t, x, round=0, chunk_bytes=1024, **extra)  # several chunks per step: they must travel together
        return time.perf_counter() - start

    def measure() -> None:
        elapsed = max(run_inproc(5, timed, latency=alpha))
        assert chain * alpha <= elapsed <= TIMING_TOLERANCE * model * alpha, f"{variant}: {elapsed:.3f} s"

    # a host stall delays every hop: judged only on a clean attempt
    retrying(measure, f"{variant}'s latency term", policy=stall_policy)


def test_ring_chunks_pipeline_across_steps(stall_policy: StallPolicy) -> None:
    """Store-and-forward links (latency alpha + bytes/B per message): chunking cuts each hop to one chunk's time.

    n = 4, segments of 64 KiB, chunks of 8 KiB, alpha = 10 ms, B = 1.6 MB/s: one chunk takes 15 ms
    per hop, a whole segment 50 ms. Pipelined, the 6 hops cost about 6 x 15 ms = 90 ms; without
    chunking they would cost 6 x 50 ms = 300 ms.
    """
    alpha, bandwidth, n = 0.01, 8192 / 0.005, 4
    x = torch.ones(n * 16384)  # float32: 64 KiB per segment

    async def timed(t: Transport) -> float:
        start = time.perf_counter()
        await ring_allreduce(t, x, round=0, chunk_bytes=8192)
        return time.perf_counter() - start

    pipelined = 2 * (n - 1) * (alpha + 8192 / bandwidth)
    unchunked = 2 * (n - 1) * (alpha + 65536 / bandwidth)

    def measure() -> None:
        elapsed = max(run_inproc(n, timed, latency=lambda s, d, nbytes: alpha + nbytes / bandwidth))
        assert pipelined <= elapsed <= TIMING_TOLERANCE * pipelined < unchunked, f"{elapsed:.3f} s"

    retrying(measure, "the ring's pipelining", policy=stall_policy)
