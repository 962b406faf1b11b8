"""Top-K, Rand-K and group quantization: round trips, exact wire bytes, guarantees, and validating decoders
that reject wrong counts, out-of-range indices and group metadata that does not fit the tensor."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from squall.training.compress import COMPRESSORS, SCHEMAS, GroupQuant, RandK, TopK
from squall.training.compress.feedback import ErrorFeedback, FeedbackConfig, FeedbackOptions
from squall.training.compress.quant import FLOAT16_MAX, quantize, round_trip
from squall.training.compress.randk import shared_indices, shared_seed
from squall.training.compress.topk import count_for
from squall.training.options import read_options
from squall.wire import ParamKind, WireError, pack_compressed, unpack_compressed
from squall.wire.compressed import pack_fields

finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)


def wire_round_trip(compressor: object, x: np.ndarray) -> tuple[np.ndarray, int]:
    """Encode, pack, unpack with every schema (as a receiver), decode; the values and the packed size."""
    payload = compressor.encode(x)  # type: ignore[attr-defined]
    data = pack_compressed(payload, compressor.schema)  # type: ignore[attr-defined]
    received = unpack_compressed(data, SCHEMAS)
    decoder = COMPRESSORS[received.compressor].for_payload(received)
    return np.asarray(decoder.decode(received).values), len(data)


@settings(max_examples=150, deadline=None)
@given(x=arrays(np.float32, st.integers(1, 300), elements=finite), ratio=st.floats(1 / 1024, 1.0))
def test_top_k_keeps_the_largest_magnitudes_exactly_and_contracts(x: np.ndarray, ratio: float) -> None:
    compressor = TopK(ratio=ratio)
    out, size = wire_round_trip(compressor, x)
    k = count_for(x.size, ratio)
    assert size == compressor.wire_bytes(x.size)
    assert np.count_nonzero(out) <= k
    kept = np.flatnonzero(out)
    np.testing.assert_array_equal(out[kept], x[kept])  # values travel exactly
    dropped = np.setdiff1d(np.arange(x.size), kept)
    if dropped.size and kept.size:  # nothing dropped is larger than anything kept (ties aside)
        assert np.abs(x[dropped]).max() <= np.abs(x).max() and np.abs(x[dropped]).max() <= np.sort(np.abs(x))[-k]
    err = float(np.sum((out.astype(np.float64) - x) ** 2))
    assert err <= (1 - k / x.size) * float(np.sum(x.astype(np.float64) ** 2)) * (1 + 1e-9) + 1e-12


def test_top_k_wire_bytes_are_eight_per_kept_coordinate_plus_a_fixed_header() -> None:
    compressor = TopK(k=1000)
    header = compressor.wire_bytes(10_000) - 8 * 1000
    assert header == TopK(k=1).wire_bytes(10_000) - 8 == 16 + len(TopK.name) + 9 * 1 + 9 * 2


def test_rand_k_is_unbiased_over_seeds_and_every_worker_draws_the_same_coordinates() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(200).astype(np.float32)
    assert np.array_equal(shared_indices(200, 20, shared_seed(7, 11)), shared_indices(200, 20, shared_seed(7, 11)))
    assert not np.array_equal(shared_indices(200, 20, shared_seed(7, 11)), shared_indices(200, 20, shared_seed(7, 12)))
    trials = 4000
    total = np.zeros(200)
    for t in range(trials):
        out, size = wire_round_trip(RandK(ratio=0.1, seed=shared_seed(0, t)), x)
        assert size == RandK(ratio=0.1).wire_bytes(200) == 16 + len(RandK.name) + 18 + 9 + 4 * 20
        total += out
    # each coordinate's estimate has variance (d/k - 1) x_i^2 = 9 x_i^2 per trial: 6 sigma of the mean
    assert np.all(np.abs(total / trials - x) <= 6 * 3 * np.abs(x) / np.sqrt(trials) + 1e-9)


@pytest.mark.parametrize(("bits", "limit"), [(8, 0.015), (4, 0.20)])
def test_group_quantization_error_is_within_half_a_step_and_the_t8_1_relative_bound(bits: int, limit: float) -> None:
    rng = np.random.default_rng(bits)
    x = rng.standard_normal(128 * 257 + 5).astype(np.float32)  # a short last group too
    compressor = GroupQuant(bits=bits, group=128)
    out, size = wire_round_trip(compressor, x)
    assert size == compressor.wire_bytes(x.size)
    q = quantize(x, bits, 128)
    per = np.repeat(q.scales.astype(np.float32), 128)[: x.size]
    assert np.all(np.abs(out - x) <= per / 2 * (1 + 1e-3) + 1e-6)
    relative = np.linalg.norm(out - x) / np.linalg.norm(x)
    assert relative <= limit / 1.4  # one quantization; T8.1's bound is for two (about sqrt 2 more)


def test_group_quantization_wire_ratio_matches_the_section_0_table() -> None:
    numel = 1 << 20  # large enough that the header is negligible
    int8, int4 = (GroupQuant(bits=b).wire_bytes(numel) / (4 * numel) for b in (8, 4))
    assert int8 == pytest.approx(0.258, abs=0.001) and int4 == pytest.approx(0.133, abs=0.001)


@settings(max_examples=100, deadline=None)
@given(x=arrays(np.float32, st.integers(1, 700), elements=finite), bits=st.sampled_from([4, 8]),
       group=st.sampled_from([1, 3, 32, 128]))
def test_group_quantization_never_clips_and_constant_groups_are_exact(x: np.ndarray, bits: int, group: int) -> None:
    out = round_trip(x, bits, group)
    q = quantize(x, bits, group)
    per = np.repeat(q.scales.astype(np.float32), group)[: x.size]
    assert np.all(np.abs(out - x) <= per / 2 * (1 + 1e-3) + np.abs(x) * 2.0**-20 + 1e-6)  # float32 rounding of z + c s
    const = np.full(group * 2, 0.5, dtype=np.float32)
    np.testing.assert_array_equal(round_trip(const, bits, group), const)


def test_group_quantization_refuses_what_float16_metadata_cannot_hold() -> None:
    with pytest.raises(ValueError, match="float16"):
        quantize(np.array([0.0, FLOAT16_MAX], dtype=np.float32), 8, 128)
    with pytest.raises(ValueError, match="bits must be one of"):
        GroupQuant(bits=2)
    with pytest.raises(ValueError, match="group must be in"):
        GroupQuant(group=0)


def top_k_bytes(numel: int, k: int, values: np.ndarray, indices: np.ndarray) -> bytes:
    return pack_fields(TopK.name, numel, [(ParamKind.U64, k)], [values, indices])


def quant_bytes(numel: int, bits: int, group: int, codes: int, scales: int, *, zeros: int | None = None,
                scale: float = 0.1) -> bytes:
    arrays: list[np.ndarray[Any, Any]] = [np.zeros(codes, np.uint8), np.full(scales, scale, np.float16),
              np.zeros(scales if zeros is None else zeros, np.float16)]
    return pack_fields(GroupQuant.name, numel, [(ParamKind.U64, bits), (ParamKind.U64, group)], arrays)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (top_k_bytes(10, 3, np.ones(2, np.float32), np.array([1, 2], np.int32)), "'values' holds 2 elements, needs 3"),
        (top_k_bytes(10, 2, np.ones(2, np.float32), np.array([1], np.int32)), "'indices' holds 1 elements, needs 2"),
        (top_k_bytes(10, 2, np.ones(2, np.float32), np.array([1, 10], np.int32)), r"outside \[0, 10\)"),
        (top_k_bytes(10, 2, np.ones(2, np.float32), np.array([-1, 3], np.int32)), r"outside \[0, 10\)"),
        (top_k_bytes(10, 2, np.ones(2, np.float32), np.array([4, 4], np.int32)), "strictly increasing"),
        (top_k_bytes(10, 11, np.ones(11, np.float32), np.arange(11, dtype=np.int32)), "k = 11 coordinates"),
        (top_k_bytes(1 << 30, 0, np.ones(0, np.float32), np.zeros(0, np.int32)), "cannot stand for a 1073741824"),
        (top_k_bytes(65537 * 1024, 65536, np.ones(65536, np.float32), np.arange(65536, dtype=np.int32)),
         "65536 coordinates cannot stand for"),
        (pack_fields(RandK.name, 1 << 28, [(ParamKind.U64, 3), (ParamKind.U64, 1)], [np.ones(3, np.float32)]),
         "3 coordinates cannot stand for"),
        (pack_fields(RandK.name, 5, [(ParamKind.U64, 6), (ParamKind.U64, 1)], [np.ones(6, np.float32)]),
         "k = 6 coordinates of a 5-element vector"),
        (pack_fields(RandK.name, 5, [(ParamKind.U64, 2), (ParamKind.U64, 1)], [np.ones(3, np.float32)]),
         "'values' holds 3 elements, needs 2"),
        (quant_bytes(256, 8, 128, 256, 3), "'scales' holds 3 elements, needs 2"),
        (quant_bytes(256, 8, 128, 256, 2, zeros=1), "'zeros' holds 1 elements, needs 2"),
        (quant_bytes(256, 8, 64, 256, 2), "'scales' holds 2 elements, needs 4"),
        (quant_bytes(256, 4, 128, 256, 2), "'codes' holds 256 elements, needs 128"),
        (quant_bytes(256, 2, 128, 64, 2), "bits must be one of"),
        (quant_bytes(256, 8, 0, 256, 0), "group must be in"),
        (quant_bytes(256, 8, 128, 256, 2, scale=-0.5), "scale is negative"),
        (pack_fields(GroupQuant.name, 3, [(ParamKind.U64, 4), (ParamKind.U64, 128)],
                     [np.array([0, 0xF0], np.uint8), np.ones(1, np.float16), np.zeros(1, np.float16)]),
         "padding nibble"),
    ],
)
def test_the_validating_decoder_rejects_payloads_that_do_not_fit_the_tensor(data: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        unpack_compressed(data, SCHEMAS)


def test_error_feedback_variants_follow_their_recurrences() -> None:
    g1, g2 = torch.tensor([3.0, -1.0, 0.5]), torch.tensor([1.0, 2.0, -4.0])

    def top1(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(v)
        i = int(v.abs().argmax())
        out[i] = v[i]
        return out

    ef14 = ErrorFeedback(FeedbackConfig("ef14"))
    p = ef14.prepare(g1)
    ef14.absorb(top1(p), top1(p))
    p2 = ef14.prepare(g2)
    assert torch.equal(p2, g2 + torch.tensor([0.0, -1.0, 0.5]))  # the residual of step 1 is added back
    ef21 = ErrorFeedback(FeedbackConfig("ef21"))
    assert ef21.needs_start
    assert torch.equal(ef21.start(g1, g1 * 2), g1 * 2) and not ef21.needs_start
    d = ef21.prepare(g2)
    assert torch.equal(d, g2 - g1)
    assert torch.equal(ef21.absorb(top1(d), top1(d) * 2), g1 * 2 + top1(d) * 2)  # Ē += mean c
    ef21m = ErrorFeedback(FeedbackConfig("ef21m", beta=0.5, dense_start=False))
    assert not ef21m.needs_start
    assert torch.equal(ef21m.prepare(g1), 0.5 * g1)  # v = 0.5 * 0 + 0.5 * g1, E = 0
    none = ErrorFeedback(FeedbackConfig("none"))
    assert torch.equal(none.absorb(g1, g2), g2) and torch.equal(none.prepare(g1), g1)


def test_feedback_settings_are_checked_naming_the_key_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"ef = 'ef99' is not an error-feedback variant; allowed: \['none'"):
        read_options(FeedbackOptions, {"ef": "ef99"}, where="feedback")
    with pytest.raises(ValueError, match=r"beta = 1.0 must be in \[0, 1\)"):
        FeedbackConfig(beta=1.0)
    with pytest.raises(ValueError, match="feedback: option dense_start='yes' is not allowed: true or false"):
        read_options(FeedbackOptions, {"dense_start": "yes"}, where="feedback")
    options = read_options(FeedbackOptions, {"ef": "ef21", "beta": 0.5, "dense_start": False}, where="feedback")
    assert options.feedback() == FeedbackConfig("ef21", 0.5, False)
