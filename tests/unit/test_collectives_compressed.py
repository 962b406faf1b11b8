"""The one all-reduce with a compressor (:func:`squall.collectives.allreduce`): the same bytes on the wire and
the same bits as the per-codec collectives it replaced, the schedule each compressor's declared properties
choose, and the checks of its arguments.

Bytes: :data:`BYTES_BEFORE` holds what every rank's transport counted per call, on the in-process
transport, with the per-codec collectives before they became one (``topk_allgather``, ``randk_allreduce``,
``arc_allreduce``, ``two_step_allreduce``, ``requant_ring_allreduce``, ``ring_allreduce``), for each codec
at three sizes and two world sizes; the entry point must send exactly as much, and :func:`sent_bytes`
must say so. Bits: each compressed schedule is compared with a reference built from what did not change
(the compressors' maths, the dense ring) the way the old collective composed them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from squall.collectives import allreduce, choose_schedule, ring_allreduce, run_inproc, sent_bytes
from squall.collectives.schedule import split_bounds
from squall.training.compress import (
    ArcTopK,
    Compression,
    DenseFloat16,
    DenseFloat32,
    GroupQuant,
    LatticeCompressor,
    RandK,
    TopK,
    arc,
)
from squall.training.compress.arc import ARC_SALT
from squall.training.compress.quant import dequantize, quantize
from squall.training.compress.randk import RANDK_SALT, shared_indices, shared_seed
from squall.transport import Transport

ROUND = 7


def _shapes(numel: int) -> list[tuple[int, ...]]:
    """A matrix, a 3-d tensor, a bias and the rest as a vector: every kind of ARC segment."""
    return [(10, 16), (2, 4, 4), (10,), (numel - 160 - 32 - 10,)]


#: Each codec as the old collectives were called: the compression of a vector of ``numel``, the schedule,
#: and the dtype the vector travels in without compression.
CODECS: dict[str, tuple[Callable[[int], Compression | None], str, torch.dtype]] = {
    "dense": (lambda d: None, "auto", torch.float32),
    "dense16": (lambda d: None, "auto", torch.float16),
    "topk": (lambda d: TopK(ratio=0.01), "auto", torch.float32),
    "topk5": (lambda d: TopK(ratio=0.05), "auto", torch.float32),
    "randk": (lambda d: RandK(ratio=0.01, seed=3), "auto", torch.float32),
    "randk_biased": (lambda d: RandK(ratio=0.1, seed=3, unbiased=False), "auto", torch.float32),
    "arc": (lambda d: ArcTopK(ratio=0.05, rank=4, cols=64, seed=1), "auto", torch.float32),
    "arc_shapes": (lambda d: ArcTopK(ratio=0.2, rank=2, shapes=_shapes(d), seed=1), "auto", torch.float32),
    "int8": (lambda d: GroupQuant(bits=8), "auto", torch.float32),
    "int4": (lambda d: GroupQuant(bits=4, group=64), "auto", torch.float32),
    "int8_hop": (lambda d: GroupQuant(bits=8), "ring", torch.float32),
    "int4_hop": (lambda d: GroupQuant(bits=4), "ring", torch.float32),
}

#: Bytes each rank sent in one call, by (codec, world size, elements), counted before the change.
BYTES_BEFORE: dict[tuple[str, int, int], list[int]] = {
    ("dense", 3, 650): [3724, 3724, 3720],
    ("dense", 3, 4099): [22120, 22116, 22116],
    ("dense", 3, 100003): [533608, 533604, 533604],
    ("dense", 8, 650): [5444, 5448, 5448, 5448, 5448, 5448, 5444, 5440],
    ("dense", 8, 4099): [29584, 29588, 29592, 29592, 29592, 29592, 29588, 29584],
    ("dense", 8, 100003): [700912, 700916, 700920, 700920, 700920, 700920, 700916, 700912],
    ("dense16", 3, 650): [1990, 1990, 1988],
    ("dense16", 3, 4099): [11188, 11186, 11186],
    ("dense16", 3, 100003): [266932, 266930, 266930],
    ("dense16", 8, 650): [3170, 3172, 3172, 3172, 3172, 3172, 3170, 3168],
    ("dense16", 8, 4099): [15240, 15242, 15244, 15244, 15244, 15244, 15242, 15240],
    ("dense16", 8, 100003): [350904, 350906, 350908, 350908, 350908, 350908, 350906, 350904],
    ("topk", 3, 650): [320, 320, 320],
    ("topk", 3, 4099): [864, 864, 864],
    ("topk", 3, 100003): [16224, 16224, 16224],
    ("topk", 8, 650): [1120, 1120, 1120, 1120, 1120, 1120, 1120, 1120],
    ("topk", 8, 4099): [3024, 3024, 3024, 3024, 3024, 3024, 3024, 3024],
    ("topk", 8, 100003): [56784, 56784, 56784, 56784, 56784, 56784, 56784, 56784],
    ("topk5", 3, 650): [736, 736, 736],
    ("topk5", 3, 4099): [3488, 3488, 3488],
    ("topk5", 3, 100003): [80224, 80224, 80224],
    ("topk5", 8, 650): [2576, 2576, 2576, 2576, 2576, 2576, 2576, 2576],
    ("topk5", 8, 4099): [12208, 12208, 12208, 12208, 12208, 12208, 12208, 12208],
    ("topk5", 8, 100003): [280784, 280784, 280784, 280784, 280784, 280784, 280784, 280784],
    ("randk", 3, 650): [288, 288, 288],
    ("randk", 3, 4099): [472, 468, 468],
    ("randk", 3, 100003): [5592, 5588, 5588],
    ("randk", 8, 650): [680, 680, 680, 680, 748, 816, 748, 680],
    ("randk", 8, 4099): [1176, 1176, 1176, 1176, 1176, 1176, 1176, 1176],
    ("randk", 8, 100003): [7896, 7896, 7896, 7896, 7896, 7896, 7896, 7896],
    ("randk_biased", 3, 650): [604, 604, 600],
    ("randk_biased", 3, 4099): [2440, 2436, 2436],
    ("randk_biased", 3, 100003): [53592, 53588, 53588],
    ("randk_biased", 8, 650): [1352, 1352, 1352, 1352, 1352, 1352, 1348, 1348],
    ("randk_biased", 8, 4099): [3760, 3760, 3760, 3760, 3760, 3760, 3756, 3756],
    ("randk_biased", 8, 100003): [70896, 70896, 70896, 70896, 70896, 70896, 70896, 70896],
    ("arc", 3, 650): [1092, 1088, 1084],
    ("arc", 3, 4099): [2924, 2924, 2920],
    ("arc", 3, 100003): [60480, 60480, 60480],
    ("arc", 8, 650): [2544, 2544, 2548, 2552, 2552, 2552, 2548, 2544],
    ("arc", 8, 4099): [4952, 4952, 4956, 4960, 4960, 4960, 4956, 4952],
    ("arc", 8, 100003): [80496, 80496, 80500, 80504, 80504, 80504, 80500, 80496],
    ("arc_shapes", 3, 650): [3900, 3900, 3896],
    ("arc_shapes", 3, 4099): [25976, 25976, 25968],
    ("arc_shapes", 3, 100003): [639764, 639760, 639756],
    ("arc_shapes", 8, 650): [6232, 6236, 6240, 6240, 6240, 6240, 6236, 6232],
    ("arc_shapes", 8, 4099): [35208, 35208, 35208, 35212, 35216, 35216, 35208, 35204],
    ("arc_shapes", 8, 100003): [840804, 840808, 840808, 840808, 840808, 840808, 840800, 840796],
    ("int8", 3, 650): [1478, 1478, 1360],
    ("int8", 3, 4099): [6223, 6223, 6098],
    ("int8", 3, 100003): [138123, 138123, 137898],
    ("int8", 8, 650): [3356, 3356, 3356, 3356, 3356, 2648, 2564, 2564],
    ("int8", 8, 4099): [10081, 9289, 9289, 9289, 9289, 9289, 9289, 8539],
    ("int8", 8, 100003): [182637, 182637, 182637, 182637, 182637, 182637, 181845, 181287],
    ("int4", 3, 650): [1053, 1053, 990],
    ("int4", 3, 4099): [3642, 3642, 3576],
    ("int4", 3, 100003): [75550, 75550, 75536],
    ("int4", 8, 650): [2691, 2691, 2691, 2475, 2475, 2475, 2475, 2313],
    ("int4", 8, 4099): [6144, 5928, 5928, 5928, 5928, 5928, 5928, 5748],
    ("int4", 8, 100003): [100480, 100480, 100480, 100264, 100264, 100264, 100264, 100180],
    ("int8_hop", 3, 650): [1478, 1478, 1360],
    ("int8_hop", 3, 4099): [6223, 6223, 6098],
    ("int8_hop", 3, 100003): [138123, 138123, 137898],
    ("int8_hop", 8, 650): [2974, 2974, 2974, 3092, 3224, 3238, 3106, 2974],
    ("int8_hop", 8, 4099): [9296, 9296, 9296, 9296, 9296, 9421, 9289, 9164],
    ("int8_hop", 8, 100003): [182280, 182280, 182280, 182280, 182412, 182637, 182505, 182280],
    ("int4_hop", 3, 650): [1025, 1025, 966],
    ("int4_hop", 3, 4099): [3470, 3470, 3408],
    ("int4_hop", 3, 100003): [71418, 71418, 71304],
    ("int4_hop", 8, 650): [2452, 2452, 2452, 2511, 2579, 2588, 2520, 2452],
    ("int4_hop", 8, 4099): [5710, 5710, 5710, 5710, 5710, 5772, 5704, 5642],
    ("int4_hop", 8, 100003): [94822, 94822, 94822, 94822, 94890, 95004, 94936, 94822],
}


def inputs(n: int, numel: int, seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed * 1000 + numel * 31 + n)
    return [torch.from_numpy(rng.standard_normal(numel).astype(np.float32)) for _ in range(n)]


def measure(n: int, numel: int, compression: Compression | None, schedule: str,
            dtype: torch.dtype = torch.float32) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Per rank: bytes sent in one call, the result, and ``local``."""
    xs = inputs(n, numel)

    async def one(transport: Transport) -> tuple[int, torch.Tensor, torch.Tensor]:
        local = torch.empty(numel)
        before = transport.total_counters().bytes_sent
        out = await allreduce(transport, xs[transport.rank].to(dtype), round=ROUND, op="mean",
                              compression=compression, schedule=schedule, local=local)
        return transport.total_counters().bytes_sent - before, out, local

    return run_inproc(n, one)


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_rank_sends_the_same_bytes_as_before_and_as_sent_bytes_says(codec: str) -> None:
    make, schedule, dtype = CODECS[codec]
    for (name, n, numel), before in BYTES_BEFORE.items():
        if name != codec:
            continue
        results = measure(n, numel, make(numel), schedule, dtype)
        assert [sent for sent, _, _ in results] == before, (codec, n, numel)
        formula = [sent_bytes(numel, n, compression=make(numel), schedule=schedule, rank=r, dtype=dtype)
                   for r in range(n)]
        assert formula == before, (codec, n, numel)
        assert all(torch.equal(results[0][1], out) for _, out, _ in results)  # the same bits on every rank
    assert measure(1, 650, make(650), schedule, dtype)[0][0] == 0  # one rank sends nothing


def test_the_dense_casts_send_what_the_ring_of_the_cast_vector_sends() -> None:
    for n, numel in ((3, 4099), (8, 650)):
        half = measure(n, numel, DenseFloat16(), "auto")
        assert [sent for sent, _, _ in half] == BYTES_BEFORE[("dense16", n, numel)]
        exact = measure(n, numel, None, "auto", torch.float16)
        assert torch.equal(half[0][1], exact[0][1].float())  # the fp16 ring's result, as float32
        assert torch.equal(half[0][2], inputs(n, numel)[0].half().float())  # local: what was sent
        single = measure(n, numel, DenseFloat32(), "auto")
        assert [sent for sent, _, _ in single] == BYTES_BEFORE[("dense", n, numel)]
        assert torch.equal(single[0][1], measure(n, numel, None, "auto")[0][1])


# -- the same bits as the old collectives, from references that did not change -----------------------


def top_k_reference(xs: list[torch.Tensor], ratio: float) -> tuple[list[np.ndarray], np.ndarray]:
    """Every rank's Top-K payload, summed in rank order at its indices, then divided by ``n``."""
    payloads = [TopK(ratio=ratio).encode(x.numpy()) for x in xs]
    mean = np.zeros(xs[0].numel(), dtype=np.float32)
    for p in payloads:
        mean[np.asarray(p.arrays["indices"], dtype=np.int64)] += np.asarray(p.arrays["values"], dtype=np.float32)
    mean /= np.float32(len(xs))
    return [np.asarray(TopK(ratio=ratio).decode(p).values) for p in payloads], mean


def group_bounds(numel: int, n: int, group: int) -> list[int]:
    """``n`` segments of whole groups, sizes differing by at most one group (the last group may be short)."""
    return [min(b * group, numel) for b in split_bounds(-(-numel // group), n)]


def two_step_reference(xs: list[torch.Tensor], bits: int, group: int) -> np.ndarray:
    """Segment ``j`` on group boundaries: its ``n`` contributions quantized once, added in rank order from
    rank ``j``'s own, divided by ``n``, quantized once more."""
    n, numel = len(xs), xs[0].numel()
    bounds = group_bounds(numel, n, group)
    out = np.empty(numel, dtype=np.float32)
    for j in range(n):
        a, b = bounds[j], bounds[j + 1]
        total = dequantize(quantize(xs[j].numpy()[a:b], bits, group)).astype(np.float32)
        for peer in sorted(set(range(n)) - {j}):
            total += dequantize(quantize(xs[peer].numpy()[a:b], bits, group))
        out[a:b] = dequantize(quantize(total * np.float32(1.0 / n), bits, group))
    return out


def requant_ring_reference(xs: list[torch.Tensor], bits: int, group: int) -> np.ndarray:
    """Segment ``s`` leaves rank ``s`` quantized; each next rank dequantizes it, adds its own, requantizes
    (the last one after dividing by ``n``)."""
    n, numel = len(xs), xs[0].numel()
    bounds = group_bounds(numel, n, group)
    out = np.empty(numel, dtype=np.float32)
    for s in range(n):
        a, b = bounds[s], bounds[s + 1]
        q = quantize(xs[s].numpy()[a:b], bits, group)
        for hop in range(1, n):
            partial = dequantize(q) + xs[(s + hop) % n].numpy()[a:b]
            if hop == n - 1:
                partial = partial * np.float32(1.0 / n)
            q = quantize(partial, bits, group)
        out[a:b] = dequantize(q)
    return out


async def shared_reference(transport: Transport, x: torch.Tensor, compression: RandK | ArcTopK) -> tuple[Any, Any]:
    """Rand-K and ARC-Top-K as their collectives composed the dense ring and their maths: ``(local, mean)``."""
    flat = x.numpy()
    if isinstance(compression, RandK):
        k = compression.count(flat.size)
        idx = shared_indices(flat.size, k, shared_seed(compression.seed, ROUND, RANDK_SALT))
        values = np.ascontiguousarray(flat[idx])
        mean = await ring_allreduce(transport, torch.from_numpy(values), round=ROUND, op="mean", tag=0x524E444B)
        scale = np.float32(flat.size / k if compression.unbiased else 1.0)
        local, out = np.zeros(flat.size, np.float32), np.zeros(flat.size, np.float32)
        local[idx], out[idx] = values * scale, mean.numpy() * scale
        return local, out
    segments = compression.plan(flat.size)
    sketches = arc.sketch_matrices(segments, compression.rank, shared_seed(compression.seed, ROUND, ARC_SALT))
    sketch = await ring_allreduce(transport, torch.from_numpy(arc.local_sketch(flat, segments, sketches)), round=ROUND,
                                  op="mean", tag=0x41524353)
    selection = arc.select(sketch.numpy(), segments, compression.ratio, compression.rank)
    rows = arc.gather_rows(flat, segments, selection)
    mean_rows = await ring_allreduce(transport, torch.from_numpy(rows), round=ROUND, op="mean", tag=0x41524352)
    return (arc.scatter_rows(rows, segments, selection, flat.size),
            arc.scatter_rows(mean_rows.numpy(), segments, selection, flat.size))


@pytest.mark.parametrize(("n", "numel"), [(3, 4099), (4, 650), (5, 100003)])
def test_top_k_gives_the_same_bits_as_its_all_gather_summed_in_rank_order(n: int, numel: int) -> None:
    results = measure(n, numel, TopK(ratio=0.05), "auto")
    locals_, mean = top_k_reference(inputs(n, numel), 0.05)
    for rank, (_, out, local) in enumerate(results):
        np.testing.assert_array_equal(out.numpy(), mean, strict=True)
        np.testing.assert_array_equal(local.numpy(), locals_[rank], strict=True)


@pytest.mark.parametrize("codec", ["randk", "randk_biased", "arc", "arc_shapes"])
@pytest.mark.parametrize(("n", "numel"), [(3, 4099), (4, 100003)])
def test_shared_support_codecs_give_the_same_bits_as_their_two_rings(codec: str, n: int, numel: int) -> None:
    compression = CODECS[codec][0](numel)
    assert isinstance(compression, RandK | ArcTopK)
    results = measure(n, numel, compression, "auto")
    xs = inputs(n, numel)

    async def one(transport: Transport) -> tuple[Any, Any]:
        return await shared_reference(transport, xs[transport.rank], compression)

    for (_, out, local), (local_ref, mean_ref) in zip(results, run_inproc(n, one), strict=True):
        np.testing.assert_array_equal(out.numpy(), mean_ref, strict=True)
        np.testing.assert_array_equal(local.numpy(), local_ref, strict=True)


@pytest.mark.parametrize(("bits", "group"), [(8, 128), (4, 64)])
@pytest.mark.parametrize(("n", "numel"), [(3, 4099), (4, 650), (8, 100003)])
def test_group_quantization_gives_the_same_bits_as_two_step_and_per_hop_ring(bits: int, group: int, n: int,
                                                                             numel: int) -> None:
    quantizer = GroupQuant(bits=bits, group=group)
    xs = inputs(n, numel)
    two_step = measure(n, numel, quantizer, "two_step")
    np.testing.assert_array_equal(two_step[0][1].numpy(), two_step_reference(xs, bits, group), strict=True)
    ring = measure(n, numel, quantizer, "ring")
    np.testing.assert_array_equal(ring[0][1].numpy(), requant_ring_reference(xs, bits, group), strict=True)
    for rank in range(n):  # local: this rank's vector as one quantization round trip decodes it
        own = dequantize(quantize(xs[rank].numpy(), bits, group))
        np.testing.assert_array_equal(two_step[rank][2].numpy(), own, strict=True)
        assert torch.equal(two_step[rank][1], two_step[0][1]) and torch.equal(ring[rank][1], ring[0][1])


def test_with_a_power_of_two_of_ranks_the_sum_is_exactly_n_times_the_mean() -> None:
    n, numel = 4, 4096
    xs = inputs(n, numel)
    for compression in (TopK(ratio=0.05), RandK(ratio=0.1), ArcTopK(ratio=0.1, cols=64), GroupQuant(bits=8)):

        async def one(transport: Transport, compression: Compression = compression) -> tuple[Any, Any]:
            x = xs[transport.rank]  # the same round: the same shared coordinates; another tag
            total = await allreduce(transport, x, round=1, op="sum", compression=compression)
            mean = await allreduce(transport, x, round=1, op="mean", compression=compression, tag=900)
            return total, mean

        total, mean = run_inproc(n, one)[0]
        assert torch.equal(total / n, mean), compression.name  # dividing by 4 is exact, scales included


# -- the schedule each compressor's declared properties choose, and the checks --------------------------


def test_each_compression_chooses_its_schedule_from_what_it_declares() -> None:
    auto = {c.name if c else "none": choose_schedule(c) for c in (None, DenseFloat32(), DenseFloat16(), RandK(),
                                                                     ArcTopK(), TopK(), GroupQuant())}
    assert auto == {"none": "ring", "dense": "ring", "dense16": "ring", "rand_k": "ring", "arc_top_k": "ring",
                    "top_k": "allgather", "groupquant": "two_step"}
    assert (RandK.summable, RandK.indices, TopK.summable, TopK.indices) == (True, "shared", False, "own")
    assert (GroupQuant.summable, GroupQuant.indices, ArcTopK.sketched, RandK.sketched) == (False, "none", True, False)
    assert choose_schedule(GroupQuant(), "ring") == "ring" and choose_schedule(None, "butterfly") == "butterfly"
    with pytest.raises(ValueError, match=r"top_k cannot be all-reduced by 'ring'; allowed: 'auto', 'allgather'"):
        choose_schedule(TopK(), "ring")
    with pytest.raises(ValueError, match=r"groupquant cannot be all-reduced by 'butterfly'; allowed: 'auto', "
                                         r"'two_step', 'ring'"):
        choose_schedule(GroupQuant(), "butterfly")
    with pytest.raises(ValueError, match=r"unknown schedule 'tree'; expected one of \('auto', 'ring'"):
        choose_schedule(None, "tree")
    with pytest.raises(ValueError, match="lattice decodes against the receiver's own reference vector"):
        choose_schedule(LatticeCompressor(bits=8, eps=0.1))


def test_the_butterfly_runs_the_exact_and_the_dense_cast_all_reduces() -> None:
    n, numel = 5, 1000
    xs = inputs(n, numel)

    async def one(transport: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        exact = await allreduce(transport, xs[transport.rank], round=0, op="sum", schedule="butterfly")
        cast = await allreduce(transport, xs[transport.rank], round=1, op="sum", compression=DenseFloat16(),
                               schedule="butterfly", algorithm="doubling")
        return exact, cast

    results = run_inproc(n, one)
    expected = torch.stack(xs).sum(dim=0)
    assert all(torch.equal(results[0][0], exact) for exact, _ in results)
    torch.testing.assert_close(results[0][0], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[0][1], expected, rtol=1e-2, atol=2e-2)
    assert results[0][1].dtype == torch.float32


def test_a_given_tag_tags_the_stages_tag_and_tag_plus_one() -> None:
    n, numel = 3, 2048
    xs = inputs(n, numel)
    compression = ArcTopK(ratio=0.1, rank=2, cols=32)

    async def one(transport: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        tagged = await allreduce(transport, xs[transport.rank], round=0, op="mean", compression=compression, tag=500)
        plain = await allreduce(transport, xs[transport.rank], round=0, op="mean", compression=compression)
        return tagged, plain

    for tagged, plain in run_inproc(n, one):
        assert torch.equal(tagged, plain)


def test_arguments_are_checked_naming_what_is_allowed() -> None:
    async def call(transport: Transport, **kwargs: Any) -> torch.Tensor:
        return await allreduce(transport, **{"tensor": torch.ones(8), "round": 0, "op": "mean", **kwargs})

    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"compression": TopK(), "op": "max"}, ValueError, "a compressed all-reduce takes 'sum' or 'mean'"),
        ({"compression": RandK(), "tensor": torch.ones(8, dtype=torch.int64)}, TypeError,
         "a compressed all-reduce takes a floating-point tensor, got torch.int64"),
        ({"compression": TopK(), "local": torch.empty(7)}, ValueError, "local holds 7 elements, the tensor 8"),
        ({"compression": DenseFloat16(), "tensor": torch.full((8,), 1e6)}, ValueError,
         "dense16: the tensor is not finite in float16"),
        ({"compression": LatticeCompressor(bits=4, eps=0.1)}, ValueError, "cannot be all-reduced"),
    ]
    for kwargs, error, message in cases:

        async def one(transport: Transport, kwargs: dict[str, Any] = kwargs) -> torch.Tensor:
            return await call(transport, **kwargs)

        with pytest.raises(error, match=message):
            run_inproc(1, one)
