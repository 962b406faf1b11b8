"""Every collective over TCP between 4 real containers, on shaped links: the exact sum on every rank.

One cluster of 4 workers for the module; for each profile the links are shaped, then the job
``collective_check`` (:mod:`squall.bench.allreduce`) runs the ring, both butterfly
variants, a gossip step and a parameter-server step on integer-valued float64 vectors whose sum
every rank knows exactly. Under ``lossy-1pct`` TCP retransmits about one segment in a hundred:
the results must still be exact, only later. A one-element ring all-reduce timed before them has
to take the ``2(n-1)`` one-way delays the profile imposes, which catches shaping that silently
did not apply (unshaped, it takes a few milliseconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from squall.bench.allreduce import CHECKS
from squall.cluster import Cluster
from squall.profiles import load_profile
from squall.shaping import Shaper, open_shaper, state_at

pytestmark = pytest.mark.docker

ENTRY = "squall.bench.allreduce:collective_check"
NUMEL = 100_003  # 800 KB of float64, not a multiple of 4: uneven segments and blocks
CHUNK_BYTES = 64 << 10  # about 4 chunks per ring segment, several per butterfly step
ONE_WAY_S = 0.005  # both profiles: 5 ms each way
#: A ring all-reduce of one element crosses 2(n-1) = 6 links one after the other; ranks leave the
#: barrier before it up to about one delay apart, so the slowest rank's clock sees at least 5.
PROBE_HOPS = 5
#: Slack on that lower bound: the delay daemon may release a packet a little early.
EARLY_TOLERANCE = 0.9


@pytest.fixture(scope="module")
def shaper(cluster4: Cluster) -> Iterator[Shaper]:
    """Name: shaper. Scope: module. Depends: cluster4. Shapes cluster4's links; cleared after."""
    shaper = open_shaper(cluster4.endpoints(), run_id=cluster4.run_id)
    try:
        yield shaper
    finally:
        shaper.close()


def _run(cluster: Cluster, shaper: Shaper, profile: str, port: int) -> list[dict[str, Any]]:
    shaper.apply(state_at(load_profile(profile), 4, 0.0))
    results = cluster.run_job(ENTRY, {"numel": NUMEL, "chunk_bytes": CHUNK_BYTES, "seed": port, "port": port},
                              timeout=90)
    shaper.check()  # the delay daemon was alive throughout: the run was shaped
    assert all(r.ok for r in results), [r.describe() for r in results]
    return [r.value for r in results]


@pytest.mark.parametrize(("profile", "port"), [("wan-5ms", 29621), ("lossy-1pct", 29622)])
def test_every_collective_gives_the_exact_sum_on_every_rank(
    cluster4: Cluster, shaper: Shaper, profile: str, port: int
) -> None:
    values = _run(cluster4, shaper, profile, port)
    assert [v["rank"] for v in values] == [0, 1, 2, 3]
    for name in CHECKS:
        per_rank = [v["results"][name] for v in values]
        wrong = {v["rank"]: r["mismatches"] for v, r in zip(values, per_rank, strict=True) if not r["exact"]}
        assert not wrong, f"{name} on {profile}: elements differing from the exact sum, by rank: {wrong}"
        hashes = {r["sha256"] for r in per_rank}
        assert len(hashes) == 1, f"{name} on {profile}: ranks hold different bits ({len(hashes)} distinct results)"
    probe = max(v["probe_s"] for v in values)
    floor = EARLY_TOLERANCE * PROBE_HOPS * ONE_WAY_S
    assert probe >= floor, (f"a one-element ring all-reduce on {profile} took {1e3 * probe:.1f} ms on the slowest "
                            f"rank, below the {1e3 * floor:.1f} ms of {PROBE_HOPS} one-way delays of 5 ms: "
                            "were the links shaped?")


def test_the_bench_job_times_ours_and_gloo_call_by_call(cluster4: Cluster, shaper: Shaper) -> None:
    shaper.apply(state_at(load_profile("wan-5ms"), 4, 0.0))
    config = {"sizes": [4096, 1 << 20], "algorithms": ["ring", "butterfly", "gloo"], "repetitions": 3, "warmup": 1,
              "port": 29623, "gloo_port": 29624, "link": {"alpha": ONE_WAY_S, "bandwidth": 1.25e8}}
    results = cluster4.run_job("allreduce_bench", config, timeout=90)
    assert all(r.ok for r in results), [r.describe() for r in results]
    rows = results[0].value["sizes"]
    assert [(r["algorithm"], r["bytes"]) for r in rows] == [
        (a, s) for s in (4096, 1 << 20) for a in ("ring", "butterfly", "gloo")]
    for row in rows:  # every call crossed shaped links: the ring and gloo's ring take 2(n-1) = 6 delays
        hops = {"ring": PROBE_HOPS, "gloo": PROBE_HOPS, "butterfly": 1}[row["algorithm"]]
        assert row["median_s_max"] >= EARLY_TOLERANCE * hops * ONE_WAY_S, row
    assert len(results[0].metrics()) == 3 * 2 * 3
