"""Pure schedules and cost models of the collectives: no transport, no tensors."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from squall.collectives.cost import (
    LinkModel,
    choose_butterfly,
    doubling_time,
    rabenseifner_time,
    ring_time,
)
from squall.collectives.schedule import (
    FoldPlan,
    block_range,
    chunk_ranges,
    doubling_gather_steps,
    doubling_partners,
    halving_steps,
    largest_power_of_two,
    ring_owner,
    ring_steps,
    split_bounds,
)


@given(total=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_split_bounds_cover_the_vector_with_near_equal_blocks(total: int, parts: int) -> None:
    bounds = split_bounds(total, parts)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    assert bounds[0] == 0 and bounds[-1] == total and len(sizes) == parts
    assert max(sizes) - min(sizes) <= 1 and sorted(sizes, reverse=True) == sizes


@given(start=st.integers(0, 100), length=st.integers(0, 500), chunk=st.integers(1, 64))
def test_chunk_ranges_tile_the_range(start: int, length: int, chunk: int) -> None:
    ranges = chunk_ranges(start, start + length, chunk)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(start, start + length))
    assert all(0 < b - a <= chunk for a, b in ranges)


@pytest.mark.parametrize("n", range(1, 10))
def test_ring_reduce_scatter_passes_each_segment_through_every_rank_once(n: int) -> None:
    steps = {r: ring_steps(r, n) for r in range(n)}
    assert all(len(s) == 2 * (n - 1) for s in steps.values())
    for r in range(n):
        for k, step in enumerate(steps[r]):
            assert step.index == k
            left = steps[(r - 1) % n][k]
            assert left.send_segment == step.recv_segment  # what the left neighbour sends is what r expects
            if k + 1 < len(steps[r]):
                assert steps[r][k + 1].send_segment == step.recv_segment  # the pipelining invariant
    for segment in range(n):
        contributors = {segment}
        holder = segment
        for k in range(n - 1):
            holder = (holder + 1) % n
            assert steps[holder][k].recv_segment == segment and steps[holder][k].reduce
            contributors.add(holder)
        assert contributors == set(range(n)) and holder == ring_owner(segment, n)


@pytest.mark.parametrize("core", [1, 2, 4, 8, 16])
def test_recursive_halving_leaves_block_r_on_rank_r_and_pairs_agree(core: int) -> None:
    for rank in range(core):
        held = (0, core)
        for step in halving_steps(rank, core):
            mirror = next(s for s in halving_steps(step.partner, core) if s.partner == rank)
            assert mirror.send_blocks == step.recv_blocks and mirror.recv_blocks == step.send_blocks
            assert set(range(*step.send_blocks)) | set(range(*step.recv_blocks)) == set(range(*held))
            held = step.recv_blocks
        assert held == (rank, rank + 1)
        for step in doubling_gather_steps(rank, core):
            assert step.send_blocks == held
            held = (min(held[0], step.recv_blocks[0]), max(held[1], step.recv_blocks[1]))
            assert held[1] - held[0] == 2 * (step.send_blocks[1] - step.send_blocks[0])
        assert held == (0, core)
        assert sorted(doubling_partners(rank, core)) == sorted(s.partner for s in halving_steps(rank, core))


@pytest.mark.parametrize("n", range(1, 20))
def test_folding_pairs_every_extra_rank_with_a_distinct_core_rank(n: int) -> None:
    fold = FoldPlan.of(n)
    assert fold.core == largest_power_of_two(n) and fold.core <= n < 2 * fold.core
    for rank in range(n):
        partner = fold.partner(rank)
        if partner is not None:
            assert fold.partner(partner) == rank and fold.is_extra(rank) != fold.is_extra(partner)
    assert sum(fold.is_extra(r) for r in range(n)) == n - fold.core


def test_block_range_maps_blocks_to_elements() -> None:
    bounds = split_bounds(10, 4)  # sizes 3, 3, 2, 2
    assert block_range(bounds, (1, 3)) == (3, 8)


def test_cost_models_match_the_closed_forms() -> None:
    link = LinkModel(alpha=1e-3, bandwidth=1e8)
    s = 4e6
    assert ring_time(16, s, link) == pytest.approx(30e-3 + 2 * 15 / 16 * s / 1e8)
    assert rabenseifner_time(16, s, link) == pytest.approx(8e-3 + 2 * 15 / 16 * s / 1e8)
    assert rabenseifner_time(12, s, link) == pytest.approx(6e-3 + 2 * 7 / 8 * s / 1e8 + 2 * (1e-3 + s / 1e8))
    assert doubling_time(16, s, link) == pytest.approx(4 * (1e-3 + s / 1e8))
    assert ring_time(1, s, link) == rabenseifner_time(1, s, link) == doubling_time(1, s, link) == 0.0


@pytest.mark.parametrize("p", [4, 8, 16])
def test_auto_switches_at_the_derived_crossover(p: int) -> None:
    link = LinkModel(alpha=1e-4, bandwidth=1e9)
    log_p = math.log2(p)
    crossover = link.alpha * link.bandwidth * log_p / (log_p - 2 * (p - 1) / p)
    assert choose_butterfly(p, 0.9 * crossover, link) == "doubling"
    assert choose_butterfly(p, 1.1 * crossover, link) == "halving_doubling"
    assert choose_butterfly(2, 1e12, link) == "doubling"  # p = 2: same bytes, one alpha less


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        split_bounds(5, 0)
    with pytest.raises(ValueError):
        halving_steps(0, 6)
    with pytest.raises(ValueError):
        LinkModel(bandwidth=0)
    with pytest.raises(ValueError):
        ring_steps(3, 3)
