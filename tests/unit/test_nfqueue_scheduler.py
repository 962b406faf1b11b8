"""Held-packet bookkeeping, batch-verdict safety, the timeline and the lateness histogram."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from squall.shaping.nfqueue.histogram import Histogram
from squall.shaping.nfqueue.scheduler import NEVER, HeldQueue, Timeline


def test_constant_delay_releases_one_batch() -> None:
    q = HeldQueue()
    q.hold_many(1_000, [1, 2, 3])
    q.hold_many(1_000, [4])  # same release time: merged
    q.hold_many(2_000, [5, 6])
    assert len(q.fifo) == 2
    rel = q.pop_due(1_500, now_us=1_010)
    assert (rel.batch_max_id, rel.batch_count, rel.single_ids) == (4, 4, [])
    assert q.held == 2
    assert q.lateness.count == 4 and q.lateness.max == 10
    assert q.next_release() == 2_000


def test_out_of_order_packets_go_to_the_heap_and_disable_batches() -> None:
    q = HeldQueue()
    q.hold(5_000, 1)
    q.hold(3_000, 2)  # overtakes packet 1
    q.hold(6_000, 3)
    assert q.next_release() == 3_000
    rel = q.pop_due(3_000, 3_000)
    assert rel.single_ids == [2] and rel.batch_max_id is None
    rel = q.pop_due(5_500, 5_500)  # heap empty again: a batch is safe
    assert rel.batch_max_id == 1 and rel.batch_count == 1


def test_batch_refused_while_a_lower_id_waits_in_the_heap() -> None:
    q = HeldQueue()
    q.hold(10_000, 1)
    q.hold(9_000, 2)  # heap, due later than packet 3
    q.hold(10_000, 3)
    q.hold(1_000, 4)  # heap
    rel = q.pop_due(1_000, 1_000)
    assert rel.single_ids == [4]
    rel = q.pop_due(9_000, 9_000)
    assert rel.single_ids == [2]


def test_pop_all_covers_everything() -> None:
    q = HeldQueue()
    q.hold(5_000, 7)
    q.hold(3_000, 8)
    q.hold_many(6_000, [9, 10])
    rel = q.pop_all()
    assert rel.batch_max_id == 10 and rel.count == 4
    assert q.held == 0 and q.next_release() == NEVER


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5_000), st.booleans()), min_size=1, max_size=80))
def test_every_packet_released_once_and_batches_never_overtake(ops: list[tuple[int, int, bool]]) -> None:
    """Simulate the kernel queue: a batch may only accept packets that are due."""
    q = HeldQueue()
    kernel: dict[int, int] = {}  # id -> release time, what the kernel still queues
    now, next_id = 0, 1
    released: list[int] = []
    for kind, delay, many in ops:
        if kind < 3:  # arrival(s)
            ids = list(range(next_id, next_id + (3 if many else 1)))
            next_id += len(ids)
            for pid in ids:
                kernel[pid] = now + delay
            if many:
                q.hold_many(now + delay, ids)
            else:
                q.hold(now + delay, ids[0])
        now += delay // 4
        rel = q.pop_due(now, now)
        for pid in rel.single_ids:
            assert kernel.pop(pid) <= now
            released.append(pid)
        if rel.batch_max_id is not None:
            covered = [pid for pid in kernel if pid <= rel.batch_max_id]
            assert len(covered) == rel.batch_count
            for pid in covered:
                assert kernel.pop(pid) <= now, "a batch verdict released a packet early"
                released.append(pid)
        assert q.held == len(kernel)
    rest = q.pop_all()
    assert rest.count == len(kernel)
    assert sorted(released + list(kernel)) == list(range(1, next_id))


def test_timeline_orders_queues_and_skips_stale_entries() -> None:
    t = Timeline()
    t.note(1, 500)
    t.note(2, 300)
    t.note(1, 200)  # earlier: replaces 500
    t.note(2, 400)  # later than the armed 300: ignored
    assert t.next_time() == 200
    assert t.pop_due(250) == [1]
    assert t.next_time() == 300  # queue 1's stale 500 entry is gone
    t.forget(2)
    assert t.next_time() == NEVER
    assert t.pop_due(10_000) == []


def test_histogram_percentiles_match_exact_ranks() -> None:
    rng = random.Random(4)
    values = [int(rng.lognormvariate(3, 1.5)) for _ in range(50_000)]
    h = Histogram()
    for v in values:
        h.record(v)
    ordered = sorted(values)
    for q in ("50", "90", "99", "99.9"):
        rank = math.ceil(Fraction(q) * len(values) / 100)  # exact nearest-rank percentile
        assert h.percentile(float(q)) == pytest.approx(ordered[rank - 1], rel=0.002, abs=1)
    assert h.max == max(values)
    assert h.summary()["count"] == len(values)


def test_histogram_weights_merge_and_negative_values() -> None:
    a, b = Histogram(), Histogram()
    a.record(-5)  # early releases count as 0
    a.record(10, weight=9)
    b.record(1_000_000)
    a.merge(b)
    assert a.count == 11 and a.percentile(50) == 10 and a.max == 1_000_000
    assert a.percentile(100) == pytest.approx(1_000_000, rel=0.001)
    assert Histogram().percentile(99) == 0
