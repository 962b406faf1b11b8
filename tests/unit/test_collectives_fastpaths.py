"""The all-reduce speed work: recycled receive buffers, the receive low-water mark, the send fast
path, single-threaded numpy reductions, the ring's chunk rule, and the benchmark job and script.

Everything here must leave results unchanged; the tests check the same bits come out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import torch

from squall.bench.allreduce import CHECKS, BenchConfig, allreduce_bench, collective_check
from squall.collectives import LinkModel, butterfly_allreduce, ring_allreduce, run_inproc
from squall.collectives.ops import as_numpy, combine, combine_into, copy_into, finalize, flat_copy
from squall.collectives.schedule import MAX_RING_CHUNK, MIN_RING_CHUNK, ring_chunk_bytes
from squall.job import JobContext, JobSpec, MetricsWriter
from squall.profiles import load_profile
from squall.shaping import state_at
from squall.transport import Transport, tcp_mesh
from squall.transport.stream import BufferPool
from squall.wire import Message
from squall.worker.registry import resolve

T = TypeVar("T")
PEERS = tuple(f"127.0.0.{i + 1}" for i in range(4))  # every 127/8 address is loopback on Linux
ROOT = Path(__file__).resolve().parents[2]


def run(awaitable: Awaitable[T], deadline: float = 60.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(awaitable, deadline)

    return asyncio.run(main())


# -- recycled receive buffers ------------------------------------------------------------------------


def test_the_pool_hands_a_buffer_out_again_only_once_nothing_refers_to_it() -> None:
    pool = BufferPool(min_bytes=1024, max_buffers=2, max_bytes=1 << 20)
    assert pool.take(100) is None  # small payloads: the decoder's own buffer
    first = pool.take(4096)
    assert first is not None
    alias = torch.frombuffer(first, dtype=torch.uint8)  # what the decoded tensor does
    del first
    second = pool.take(4096)
    assert second is not None and pool.reused == 0  # the first is still aliased: a fresh one
    view = alias[10:20]
    del alias  # a view of the tensor still holds the memory
    third = pool.take(4096)  # full of buffers in use: the oldest is forgotten (its user keeps it)
    assert third is not None and pool.reused == 0 and pool.held_bytes == 2 * 4096
    del view, second, third
    again = pool.take(3000)  # fits within a factor two of an idle buffer
    assert again is not None and len(again) == 3000 and pool.reused == 1
    assert pool.take((1 << 20) + 1) is None  # larger than the pool may hold


def test_a_full_pool_forgets_idle_buffers_first_then_the_oldest() -> None:
    pool = BufferPool(min_bytes=1024, max_buffers=3, max_bytes=1 << 20)
    idle = [pool.take(4096), pool.take(8192)]
    busy = pool.take(2048)
    assert all(b is not None for b in [*idle, busy])
    del idle
    for size in (300_000, 600_000, 100_000):  # none fits an idle buffer: each forces room to be made
        fresh = pool.take(size)
        assert fresh is not None and len(fresh) == size
        del fresh
    assert pool.held_bytes <= 1 << 20 and len(pool._arrays) <= 3
    assert busy is not None and len(busy) == 2048
    assert pool.reused == 0
    again = pool.take(60_000)  # the idle 100_000-byte buffer fits within a factor two
    assert again is not None and pool.reused == 1


def test_large_messages_arrive_intact_whether_kept_or_dropped() -> None:
    async def main() -> tuple[int, int]:
        a, b = await tcp_mesh(2)
        try:
            kept = []
            for k in range(12):  # 12 x 1 MiB: more than one connection's pool holds
                sent = torch.arange(k, k + (1 << 18), dtype=torch.float32)
                await a.send(1, Message.of_tensor(sent, round=k))
                message = await b.recv(0, round=k)
                assert message.tensor is not None
                kept.append((sent, message.tensor))
            for sent, got in kept:  # a recycled buffer would have overwritten an earlier one
                assert torch.equal(sent, got)
            conn = b._links[0].conn
            assert conn is not None
            before = conn.pool.reused
            for k in range(12, 20):
                sent = torch.full((1 << 18,), float(k))
                await a.send(1, Message.of_tensor(sent, round=k))
                message = await b.recv(0, round=k)
                assert message.tensor is not None and torch.equal(message.tensor, sent)
                del message
            return before, conn.pool.reused
        finally:
            await asyncio.gather(a.close(), b.close())

    before, after = run(main())
    assert after > before  # dropped tensors give their buffers back


def test_frames_of_every_size_in_both_directions_at_once() -> None:
    """The low-water mark may only ask for bytes the current frame still owes: never a hang."""
    sizes = [1, 7, 1 << 10, (1 << 16) - 3, 1 << 16, (1 << 16) + 5, 300_001, 1 << 20, 3_000_017, 1 << 22, 2]

    async def main() -> None:
        a, b = await tcp_mesh(2, default_timeout=20)
        try:
            async def send(src: Transport, dst: int) -> None:
                for k, n in enumerate(sizes):
                    await src.send(dst, Message.of_tensor(torch.full((n,), float(k), dtype=torch.float32), round=k))

            async def recv(dst: Transport, src: int) -> None:
                for k, n in enumerate(sizes):
                    message = await dst.recv(src, round=k)
                    assert message.tensor is not None and message.tensor.numel() == n
                    assert bool((message.tensor == k).all())

            await asyncio.gather(send(a, 1), send(b, 0), recv(a, 1), recv(b, 0))
        finally:
            await asyncio.gather(a.close(), b.close())

    run(main())


def test_a_large_frame_sent_in_slow_pieces_by_a_raw_peer_is_received() -> None:
    """The mark is set to the rest of the payload; a sender trickling it must still get through."""

    async def main() -> None:
        a, b = await tcp_mesh(2, default_timeout=20)
        try:
            tensor = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB
            got: list[Message] = []

            async def recv() -> None:
                got.append(await b.recv(0, round=3))

            receiver = asyncio.ensure_future(recv())
            await a.send(1, Message.of_tensor(tensor[:1], round=1))  # connect and warm up
            await b.recv(0, round=1)
            conn = a._links[1].conn
            assert conn is not None
            from squall.wire import encode_message

            frame = encode_message(Message.of_tensor(tensor, round=3), sender=0)
            data = frame.tobytes()
            async with conn.write_lock:  # write the frame by hand in 7 pieces with pauses
                step = len(data) // 7 + 1
                for start in range(0, len(data), step):
                    await conn.send_parts([data[start : start + step]])
                    await asyncio.sleep(0.02)
            await asyncio.wait_for(receiver, 10)
            assert got[0].tensor is not None and torch.equal(got[0].tensor, tensor)
        finally:
            await asyncio.gather(a.close(), b.close())

    run(main())


# -- single-threaded reductions ------------------------------------------------------------------------


_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16,
           torch.bfloat16, torch.complex64]
#: max and min are not defined for bool and complex (check_op refuses them)
_OPS_AND_DTYPES = [(op, dtype) for op in ("sum", "max", "min") for dtype in _DTYPES
                   if op == "sum" or not (dtype == torch.bool or dtype.is_complex)]


@pytest.mark.parametrize(("op", "dtype"), _OPS_AND_DTYPES)
def test_numpy_and_torch_reductions_give_the_same_bits(dtype: torch.dtype, op: str) -> None:
    gen = torch.Generator().manual_seed(3)
    a = (torch.randn(10_001, generator=gen) * 50).to(dtype)
    b = (torch.randn(10_001, generator=gen) * 50).to(dtype)
    if op == "sum":
        expected = torch.logical_or(a, b) if dtype == torch.bool else a + b
    else:
        expected = torch.maximum(a, b) if op == "max" else torch.minimum(a, b)
    dst = a.clone()
    combine(op, dst, b)  # type: ignore[arg-type]
    into = torch.empty_like(a)
    combine_into(op, a, b, into)  # type: ignore[arg-type]
    assert torch.equal(dst, expected) and torch.equal(into, expected)
    assert (as_numpy(a) is None) == (dtype in (torch.float16, torch.bfloat16))


def test_copies_and_the_mean_match_torch() -> None:
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    flat = flat_copy(x)
    assert not flat.requires_grad and flat.is_contiguous() and torch.equal(flat, x.detach().reshape(-1))
    flat[0] = 123.0
    assert float(x.detach()[0, 0]) != 123.0  # a copy, not a view
    strided = torch.arange(20.0).reshape(4, 5).t()
    assert torch.equal(flat_copy(strided), strided.reshape(-1))
    dst = torch.zeros(6, dtype=torch.bfloat16)
    copy_into(dst, torch.arange(6, dtype=torch.bfloat16))
    assert torch.equal(dst, torch.arange(6, dtype=torch.bfloat16))
    for dtype in (torch.float32, torch.float64, torch.float16, torch.complex64):
        value = torch.randn(1001).to(dtype) * 7
        mean = value.clone()
        finalize("mean", mean, 3)
        assert torch.equal(mean, value / 3)


# -- the ring's chunks -------------------------------------------------------------------------------


@pytest.mark.parametrize(("nbytes", "n", "chunk"), [
    (4 << 10, 8, MIN_RING_CHUNK),  # a latency-bound vector: one message per step
    (1 << 20, 4, MIN_RING_CHUNK),  # 256 KiB segments: one chunk
    (16 << 20, 4, MIN_RING_CHUNK),  # 4 MiB segments: four chunks of 1 MiB
    (16 << 20, 8, MIN_RING_CHUNK),  # 2 MiB segments: two
    (64 << 20, 8, 2 << 20),  # 8 MiB segments: four of 2 MiB
    (64 << 20, 4, MAX_RING_CHUNK),  # 16 MiB segments: four of the cap
    (1 << 30, 4, MAX_RING_CHUNK),
    (0, 3, MIN_RING_CHUNK),
])
def test_the_automatic_chunk_is_a_quarter_segment_within_bounds(nbytes: int, n: int, chunk: int) -> None:
    assert ring_chunk_bytes(nbytes, n) == chunk


def test_the_default_chunks_give_the_same_bits_as_explicit_ones() -> None:
    n, numel = 4, 3_000_007  # 12 MB of float32: three chunks per segment by default
    inputs = [torch.randn(numel, generator=torch.Generator().manual_seed(r)) for r in range(n)]

    async def both(t: Transport) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = inputs[t.rank]
        return (await ring_allreduce(t, x, round=0), await ring_allreduce(t, x, round=1, chunk_bytes=4096),
                await butterfly_allreduce(t, x, round=2, algorithm="halving_doubling"))

    results = run_inproc(n, both)
    for ring_default, ring_small, fly in results:
        assert torch.equal(ring_default, results[0][0]) and torch.equal(fly, results[0][2])
        assert torch.equal(ring_small, ring_default)  # the ring's reduction order does not depend on chunks


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_the_ring_reads_its_input_in_place_and_never_writes_it(dtype: torch.dtype) -> None:
    n = 3
    bases = [(torch.arange(2 * 70_001) % (5 + r)).to(dtype) for r in range(n)]
    inputs = [b.reshape(2, -1).t() for b in bases]  # non-contiguous: the ring flattens a copy
    grads = [torch.arange(10_000, dtype=torch.float32).requires_grad_() for _ in range(n)]
    before = [b.clone() for b in bases]

    async def both(t: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        return (await ring_allreduce(t, inputs[t.rank], round=0, chunk_bytes=8192),
                await ring_allreduce(t, grads[t.rank], round=1))

    results = run_inproc(n, both)
    expected = inputs[0].clone()
    for x in inputs[1:]:
        expected = torch.logical_or(expected, x) if dtype == torch.bool else expected + x
    for out, summed in results:
        assert torch.equal(out, expected) and out.shape == inputs[0].shape
        assert torch.equal(summed, 3 * torch.arange(10_000, dtype=torch.float32)) and not summed.requires_grad
    assert all(torch.equal(b, c) for b, c in zip(bases, before, strict=True))


# -- the jobs ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_job(tmp_path: Path, entry: Callable[[JobContext], Any], config: dict[str, Any]) -> list[Any]:
    results: list[Any] = [None] * len(PEERS)

    def one(rank: int) -> None:
        spec = JobSpec(job_id="t", entry="x", rank=rank, world_size=len(PEERS), peers=PEERS,
                       out_dir=str(tmp_path / str(rank)), config=config, deadline_s=60.0)
        Path(spec.out_dir).mkdir(parents=True)
        with MetricsWriter(Path(spec.out_dir) / "metrics.jsonl") as metrics:
            ctx = JobContext(spec=spec, out_dir=Path(spec.out_dir), metrics=metrics, started=time.monotonic())
            try:
                results[rank] = entry(ctx)
            except Exception as exc:
                results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(PEERS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def test_the_bench_job_times_both_algorithms_over_loopback(tmp_path: Path) -> None:
    assert resolve("allreduce_bench") is allreduce_bench
    config = {"sizes": [4096, 1 << 18], "repetitions": 3, "warmup": 1, "port": _free_port(),
              "link": {"alpha": 0.005, "bandwidth": 1.25e8}, "profile": True}
    results = _run_job(tmp_path, allreduce_bench, config)
    for value in results:
        rows = value["sizes"]
        assert [(r["algorithm"], r["bytes"]) for r in rows] == [("ring", 4096), ("butterfly", 4096),
                                                                ("ring", 1 << 18), ("butterfly", 1 << 18)]
        assert all(0 < r["min_s"] <= r["median_s"] <= r["median_s_max"] and r["cpu_s"] >= 0 for r in rows)
        assert rows[1]["variant"] == "doubling"  # 4 KiB at 5 ms: latency wins
    assert len({r["sizes"][0]["median_s_max"] for r in results}) == 1  # one all-reduce of the medians
    records = (tmp_path / "0" / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 3 * 4
    assert "function calls" in (tmp_path / "0" / "profile.txt").read_text()


def test_the_check_job_finds_every_collective_exact(tmp_path: Path) -> None:
    config = {"numel": 10_007, "chunk_bytes": 4096, "seed": 5, "port": _free_port()}
    results = _run_job(tmp_path, collective_check, config)
    for name in CHECKS:
        assert all(v["results"][name]["exact"] for v in results), name
        assert len({v["results"][name]["sha256"] for v in results}) == 1, name
    assert all(v["probe_s"] > 0 for v in results)


@pytest.mark.parametrize(("config", "message"), [
    ({"sizes": []}, "sizes"),
    ({"sizes": [2]}, "sizes"),
    ({"algorithms": ["tree"]}, "algorithms"),
    ({"repetitions": 0}, "repetitions"),
    ({"warmup": {"4096": -1}, "sizes": [4096]}, "warmup"),
    ({"chunk_bytes": 0}, "chunk_bytes"),
    ({"butterfly": "binomial"}, "butterfly"),
])
def test_bad_bench_configs_say_which_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig.from_json(config)


def test_bench_config_per_size_counts() -> None:
    config = BenchConfig.from_json({"sizes": [4096, 1 << 20], "repetitions": {"1048576": 3}, "warmup": 0})
    assert config.repetitions == {4096: 10, 1 << 20: 3} and config.warmup == {4096: 0, 1 << 20: 0}
    assert config.link == LinkModel()


# -- the benchmark script's pure parts ---------------------------------------------------------------


def _bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_allreduce", ROOT / "benchmarks" / "allreduce.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_allreduce"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_benchmark_sizes_links_plans_and_verdicts() -> None:
    bench = _bench_module()
    sizes = [bench.parse_size(s) for s in ("4KB", "1MB", "16MiB", "512", "1.5KB")]
    assert sizes == [4096, 1 << 20, 16 << 20, 512, 1536]
    assert bench.size_label(64 << 20) == "64MB" and bench.size_label(1000) == "1000B"
    link = bench.link_of(state_at(load_profile("thin-100mbit"), 4, 0.0))
    assert link == LinkModel(alpha=0.005, bandwidth=12.5e6)
    plan = bench.Plan(repetitions=10, budget_s=6.0, warmup=2, rounds=2)
    assert plan.counts(4, 64 << 20, link) == (1, 2)  # 8 s per call: the minimum, one warm-up
    assert plan.counts(4, 4 << 10, link) == (2, 5)  # 10 calls over two rounds
    row = bench.summarize([[1.0, 3.0, 2.0], [4.0, 4.0, 5.0]], 2, 100)
    assert row["median_s"] == 4.0 and row["median_s_rank0"] == 2.0 and row["min_s"] == 1.0 and row["busbw"] == 25.0

    keys = ("algorithm", "profile", "workers", "bytes", "vs_gloo", "link_share")
    cases = [("ring", "lan", 4, 1 << 20, 1.1, 0.5), ("ring", "lan", 4, 4 << 10, 3.0, 0.0),
             ("butterfly", "wan-5ms", 8, 4 << 10, 0.7, 0.0), ("ring", "thin-100mbit", 4, 64 << 20, 1.0, 0.9)]
    verdicts = bench.verdicts([dict(zip(keys, case, strict=True)) for case in cases])
    met = [v["met"] for v in verdicts.values()]
    assert met == [True, False, True]  # small rings do not count; the butterfly misses; thin is met
