"""Moshpit's pure parts: grid and keys, groups given a view, free cells, shares, weighted means, membership."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from squall.protocols.moshpit import messages as msg
from squall.protocols.moshpit.grid import Grid, candidates, default_cell, free_cell, grid_for, groups_of, leader_of
from squall.protocols.moshpit.membership import Heartbeat, Membership, everyone_reached
from squall.protocols.moshpit.options import MoshpitOptions
from squall.protocols.moshpit.partition import (
    balanced_fractions,
    blend,
    blend_into,
    equal_fractions,
    group_weight,
    shard_bounds,
    weighted_mean,
)
from squall.training.options import read_options
from squall.wire import Message

EXACT_TOLERANCE = 1e-12


@pytest.mark.parametrize(("side", "dims"), [(2, 3), (4, 2), (3, 2), (5, 1)])
def test_coordinates_round_trip_and_lines_partition_the_grid(side: int, dims: int) -> None:
    grid = Grid(side, dims)
    assert [grid.cell(grid.coords(c)) for c in range(grid.cells)] == list(range(grid.cells))
    for t in range(2 * dims):
        lines = {grid.line(c, t) for c in range(grid.cells)}
        assert sorted(itertools.chain.from_iterable(lines)) == list(range(grid.cells))
        assert all(len(line) == side for line in lines)
        for line in lines:
            keys = {grid.key(c, t) for c in line}
            assert len(keys) == 1 and next(iter(keys)).axis == t % dims


def test_grid_validation_and_fitting() -> None:
    with pytest.raises(ValueError, match="side >= 2"):
        Grid(1, 3)
    with pytest.raises(ValueError, match="cell 8 not in range"):
        Grid(2, 3).coords(8)
    assert Grid.fitting(8, 2) == Grid(2, 3)
    assert Grid.fitting(9, 2) == Grid(2, 4)
    assert Grid.fitting(16, 4) == Grid(4, 2)
    assert grid_for(6) == Grid(2, 3)
    assert default_cell(7, Grid(2, 3)) == 7 and default_cell(8, Grid(2, 3)) is None
    assert str(Grid(4, 2).key(6, 3)) == "r3.a1.[1]"


def simulate(values: dict[int, float], cells: dict[int, int], grid: Grid, rounds: int) -> dict[int, float]:
    """Grid averaging with the pure group formation (no network)."""
    for t in range(rounds):
        for group in groups_of(cells, grid, t):
            mean = sum(values[r] for r in group) / len(group)
            for r in group:
                values[r] = mean
    return values


@pytest.mark.parametrize(("side", "dims"), [(2, 3), (4, 2), (3, 2)])
def test_groups_of_a_full_view_reach_the_exact_mean_in_d_rounds(side: int, dims: int) -> None:
    grid = Grid(side, dims)
    cells = {r: r for r in range(grid.cells)}
    start = {r: float((r * 7919) % 101) for r in cells}
    mean = sum(start.values()) / len(start)
    assert all(len(g) == side for t in range(dims) for g in groups_of(cells, grid, t))
    after = simulate(dict(start), cells, grid, dims)
    assert max(abs(v - mean) for v in after.values()) <= EXACT_TOLERANCE * abs(mean)
    before_last = simulate(dict(start), cells, grid, dims - 1)
    assert max(abs(v - mean) for v in before_last.values()) > 1e-6  # d - 1 rounds are not enough


def test_candidates_and_leader_follow_the_view() -> None:
    grid = Grid(2, 3)
    cells = {r: r for r in range(8)}
    assert candidates(cells, grid, 5, 0) == (1, 5)  # axis 0: cells 1 (001) and 5 (101)
    assert candidates(cells, grid, 5, 1) == (5, 7)
    assert candidates(cells, grid, 5, 2) == (4, 5)
    del cells[4]
    assert candidates(cells, grid, 5, 2) == (5,)
    assert leader_of((5, 7, 3)) == 3


def test_free_cell_prefers_its_own_then_the_emptiest_line() -> None:
    grid = Grid(2, 3)
    assert free_cell(range(8), grid) is None
    assert free_cell([0, 1, 2, 3, 4, 6, 7], grid, preferred=0) == 5  # a leaver's cell is taken over
    assert free_cell([0, 1, 2], grid, preferred=6) == 6
    # cells 0 (000) and 1 (001) are taken: 6 (110) and 7 (111) share no line with them; the lower wins
    assert free_cell([0, 1], grid) == 6


def test_equal_and_balanced_shares() -> None:
    assert equal_fractions(4) == (0.25,) * 4
    assert balanced_fractions([1.0, 5.0]) == (0.5, 0.5)  # m = 2: every split costs S/B
    shares = balanced_fractions([100.0, 100.0, 100.0, 100.0])
    assert shares == pytest.approx((0.25,) * 4)
    skewed = balanced_fractions([100.0, 100.0, 100.0, 10.0])
    assert skewed[3] == 0.0 and sum(skewed) == pytest.approx(1.0)  # a thin link reduces nothing
    busy = [(1 + 2 * f) / b for f, b in zip(skewed, [100.0, 100.0, 100.0, 10.0], strict=True) if f > 0]
    assert max(busy) == pytest.approx(min(busy))  # active owners finish together


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.5, max_value=1000), min_size=3, max_size=8))
def test_balanced_shares_beat_equal_shares(bandwidths: list[float]) -> None:
    m = len(bandwidths)

    def slowest(shares: tuple[float, ...]) -> float:
        return max((1 + (m - 2) * f) / b for f, b in zip(shares, bandwidths, strict=True))

    balanced = balanced_fractions(bandwidths)
    assert all(f >= 0 for f in balanced) and sum(balanced) == pytest.approx(1.0)
    assert slowest(balanced) <= slowest(equal_fractions(m)) * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5000), st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=9))
def test_shard_bounds_cover_exactly(numel: int, fractions: list[float]) -> None:
    if sum(fractions) <= 0:
        fractions = [*fractions[:-1], 1.0]
    bounds = shard_bounds(numel, fractions)
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a <= b for a, b in bounds)
    assert all(b0 == a1 for (_, b0), (a1, _) in itertools.pairwise(bounds))


def test_weighted_mean_blend_and_group_weight() -> None:
    a, b = torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 6.0], dtype=torch.float64)
    mean = weighted_mean([(1.0, a), (3.0, b)])
    assert mean is not None and torch.equal(mean, torch.tensor([2.5, 5.0], dtype=torch.float64))
    assert weighted_mean([(0.0, a), (0.0, b)]) is None
    pulled = weighted_mean([(0.0, a), (2.0, b)])
    assert pulled is not None and torch.equal(pulled, b)  # a joiner of weight 0 does not pull
    assert torch.equal(blend(a, b, 0.5), torch.tensor([2.0, 4.0], dtype=torch.float64))
    assert torch.equal(blend(a, b, 1.0), b)
    assert group_weight([1.0, 3.0]) == 2.0
    for alpha in (0.5, 1.0):
        out = torch.full((2,), float("nan"), dtype=torch.float64)
        blend_into(out, a, b, alpha)
        assert torch.equal(out, blend(a, b, alpha))
    with pytest.raises(ValueError, match="weights must be >= 0"):
        weighted_mean([(-1.0, a)])


def test_weighted_grid_rounds_are_exact_when_members_carry_the_mean_weight() -> None:
    grid = Grid(2, 2)
    x = {r: float(r * r) for r in range(4)}
    w = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
    target = sum(w[r] * x[r] for r in x) / sum(w.values())
    for t in range(2):
        for group in groups_of({r: r for r in range(4)}, grid, t):
            mean = sum(w[r] * x[r] for r in group) / sum(w[r] for r in group)
            carried = group_weight([w[r] for r in group])
            for r in group:
                x[r], w[r] = mean, carried
    assert max(abs(v - target) for v in x.values()) < EXACT_TOLERANCE


def beat(inc: int, cell: int | None, round: int = 0, *, reached: bool = False, step: int = 0) -> Heartbeat:
    return Heartbeat(inc, cell, round, reached, step)


def test_membership_presumes_then_times_out_and_sees_restarts() -> None:
    view = Membership(rank=0, world_size=4, grid=Grid(2, 2), timeout_s=1.0, now=0.0)
    assert set(view.alive(0.5)) == {1, 2, 3}
    assert view.cells(0.5) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert not view.heard(1, beat(11, 1, 3), now=0.9)
    assert set(view.alive(1.5)) == {1}  # 2 and 3 never spoke up
    assert view.max_round(1.5) == 3
    view.touch(1, 2.4)  # traffic counts as a sign of life
    assert view.is_alive(1, 3.3) and not view.is_alive(1, 3.5)
    assert view.heard(1, beat(12, 1), now=4.0)  # a new incarnation: it restarted
    view.left(1)
    assert not view.is_alive(1, 4.0)


def test_cell_conflicts_go_to_the_lower_rank_and_the_loser_moves() -> None:
    view = Membership(rank=3, world_size=4, grid=Grid(2, 2), timeout_s=1.0, now=0.0, presume=False)
    assert view.cell is None and view.cells(0.0) == {}
    view.heard(0, beat(1, 0), 0.0)
    view.heard(1, beat(2, 3), 0.0)  # 1 took 3's default cell while 3 was away
    assert view.settle_cell(0.1) == 1  # 3 takes over the free cell of the missing rank 1
    view.heard(2, beat(3, 1), 0.2)  # a lower rank claims it too
    assert view.cells(0.2)[2] == 1 and 3 not in view.cells(0.2)
    assert view.settle_cell(0.2) == 2
    assert view.cells(0.2) == {0: 0, 1: 3, 2: 1, 3: 2}


def test_everyone_reached() -> None:
    view = Membership(rank=0, world_size=3, grid=Grid(2, 2), timeout_s=1.0, now=0.0)
    view.heard(1, beat(1, 1, reached=True), 0.0)
    assert not everyone_reached(view.alive(0.5), True)  # rank 2 is presumed alive and has not reached
    assert everyone_reached(view.alive(1.5), True)  # ... until it times out
    assert not everyone_reached(view.alive(0.5), False)


def test_control_messages_round_trip_and_reject_garbage() -> None:
    info = msg.GroupInfo(77, 5, (1, 4, 6), (1.0, 0.0, 2.0), (0.5, 0.25, 0.25), leader=1)
    sent = msg.group(info)
    received = Message(sent.kind, sent.round, sent.tag, control=sent.control, sender=1)
    assert msg.op_of(received) is msg.Op.GROUP and msg.parse_group(received) == info
    joined = msg.parse_join(msg.join([3, 1, 0], 0.5, None, 3))
    assert joined == msg.Join((3, 1, 0), 0.5, None)
    hb = msg.heartbeat(beat(9, None, 4, reached=True, step=40), 4)
    assert msg.parse_heartbeat(hb) == beat(9, None, 4, reached=True, step=40)
    bad = [
        Message.of_control({"op": 99}),
        Message.of_control({"op": 3, "gid": 5, "members": [2, 1], "weights": [1, 1], "fractions": [1, 1]}),
        Message.of_control({"op": 2, "key": "r1", "weight": 1}),
        Message.of_control({"op": 2, "key": [1], "weight": -1}),
        Message.of_control({"op": 1, "inc": 1, "cell": -3, "step": 0}),
    ]
    for message in bad:
        with pytest.raises(msg.BadMessage):
            op = msg.op_of(message)
            {msg.Op.GROUP: msg.parse_group, msg.Op.JOIN: msg.parse_join, msg.Op.HEARTBEAT: msg.parse_heartbeat}[op](
                message
            )


def test_options_validate_and_build_the_grid() -> None:
    options = read_options(MoshpitOptions, {"group_size": 4, "local_steps": 2, "overlap": False, "alpha": 0.5},
                           where="moshpit options")
    assert options.grid(8) == Grid(4, 2) and options.averager().allreduce.alpha == 0.5
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['group'\]; allowed: \['group_size'"):
        read_options(MoshpitOptions, {"group": 4}, where="moshpit options")
    with pytest.raises(ValueError, match="fewer than"):
        MoshpitOptions(dims=2).grid(5)
    with pytest.raises(ValueError, match="sender_timeout_s < reducer_timeout_s"):
        MoshpitOptions(sender_timeout_s=5.0, reducer_timeout_s=5.0)


@settings(max_examples=50, deadline=None)
@given(
    # weights as rounds carry them: 0 (a joiner) or a mean of step counts; a weight that underflows in
    # float32 (below ~1e-38) is not one, and there the two roundings may differ
    st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 10.0)), min_size=1, max_size=5),
    st.integers(1, 300),
    st.integers(0, 2**31 - 1),
)
def test_weighted_mean_has_the_bits_of_summing_from_zero(weights: list[float], numel: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(numel, generator=gen, dtype=torch.float32) for _ in weights]
    got = weighted_mean(list(zip(weights, xs, strict=True)))
    if sum(weights) == 0:
        assert got is None
        return
    reference = torch.zeros(numel, dtype=torch.float32)
    for w, x in zip(weights, xs, strict=True):
        if w:
            reference.add_(x, alpha=w)
    assert got is not None and torch.equal(got, reference.div_(sum(weights)))
