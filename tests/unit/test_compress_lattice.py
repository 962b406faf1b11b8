"""The shared lattice quantizer (T2.1): exact within the radius, error <= eps/2, failures detected outside it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from squall.training.compress.lattice import (
    decode,
    decode_point,
    encode,
    lattice_checksum,
    lattice_point,
    pack_codes,
    packed_size,
    quantize,
    radius,
    spacing_for,
    unpack_codes,
)

#: Slack for float64 rounding in |x - x'| <= eps/2 (relative to eps; the values stay below 1e6 eps).
ROUNDING_TOLERANCE = 1e-6
#: Inside-radius draws stay this fraction of the radius away from it (rounding of y = x + delta).
INSIDE = 0.99

bits_st = st.sampled_from([4, 8])
eps_st = st.floats(min_value=1e-4, max_value=10.0)


@st.composite
def pairs(draw: st.DrawFn, *, inside: bool) -> tuple[np.ndarray, np.ndarray, float, int]:
    """``(x, y, eps, bits)`` with y within (or, on one coordinate, beyond) the decoding radius of x."""
    bits, eps = draw(bits_st), draw(eps_st)
    n = draw(st.integers(min_value=1, max_value=64))
    x = draw(arrays(np.float64, n, elements=st.floats(-1e3 * eps, 1e3 * eps)))
    r = radius(eps, bits)
    unit = draw(arrays(np.float64, n, elements=st.floats(-1.0, 1.0)))
    y = x + INSIDE * r * unit
    if not inside:
        q = 1 << bits
        coord = draw(st.integers(0, n - 1))
        beyond = draw(st.floats(1.01, 50.0)) * (q + 1) * eps / 2
        y[coord] = x[coord] + draw(st.sampled_from([-1.0, 1.0])) * beyond
    return x, y, eps, bits


@settings(max_examples=300, deadline=None)
@given(pairs(inside=True))
def test_inside_the_radius_decoding_is_exact_and_the_error_is_at_most_half_a_step(
    case: tuple[np.ndarray, np.ndarray, float, int],
) -> None:
    x, y, eps, bits = case
    out = decode(encode(x, eps, bits), y)
    assert out.ok, f"decode failed although ||x - y||_inf = {np.abs(x - y).max():.4g} < radius {radius(eps, bits):.4g}"
    np.testing.assert_array_equal(out.values, quantize(x, eps))
    assert np.abs(out.values - x).max() <= eps / 2 * (1 + ROUNDING_TOLERANCE)


@settings(max_examples=300, deadline=None)
@given(pairs(inside=False))
def test_outside_the_radius_decoding_is_wrong_and_the_checksum_says_so(
    case: tuple[np.ndarray, np.ndarray, float, int],
) -> None:
    x, y, eps, bits = case
    encoded = encode(x, eps, bits)
    k = lattice_point(x, eps)
    wrong = decode_point(encoded.codes, eps, bits, y) != k
    assert wrong.any(), "a coordinate beyond (q + 1) eps / 2 must decode to another lattice point"
    far = np.abs(x - y) > (encoded.modulus + 1) * eps / 2
    assert wrong[far].all()
    assert not decode(encoded, y).ok


@settings(max_examples=200, deadline=None)
@given(bits_st, st.floats(0.0, 100.0), st.floats(1.01, 8.0), st.integers(0, 2**32))
def test_spacing_for_a_distance_makes_a_reference_at_that_distance_decodable(
    bits: int, distance: float, safety: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=10.0, size=32)
    y = x + rng.uniform(-distance, distance, size=32)
    eps = spacing_for(distance, bits, safety=safety)
    assert radius(eps, bits) >= safety * distance * (1 - 1e-12)
    assert decode(encode(x, eps, bits), y).ok


@settings(max_examples=200, deadline=None)
@given(bits_st, st.integers(0, 301), st.integers(0, 2**32))
def test_codes_pack_into_bits_per_coordinate_and_back(bits: int, count: int, seed: int) -> None:
    codes = np.random.default_rng(seed).integers(0, 1 << bits, size=count).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.size == packed_size(count, bits) == math.ceil(count * bits / 8)
    np.testing.assert_array_equal(unpack_codes(packed, bits, count), codes)


def test_unpacking_rejects_wrong_lengths_and_nonzero_padding() -> None:
    with pytest.raises(ValueError, match="cannot hold exactly"):
        unpack_codes(np.zeros(3, dtype=np.uint8), 4, 3)
    with pytest.raises(ValueError, match="padding"):
        unpack_codes(np.array([0x21, 0xF3], dtype=np.uint8), 4, 3)
    with pytest.raises(ValueError, match=">= 2"):
        pack_codes(np.array([16], dtype=np.uint8), 4)


def test_the_checksum_covers_every_coordinate() -> None:
    k = np.arange(100, dtype=np.int64)
    base = lattice_checksum(k)
    for i in range(100):
        changed = k.copy()
        changed[i] += 256  # the same residue modulo q: exactly the error a bad reference produces
        assert lattice_checksum(changed) != base


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: encode(np.zeros(3), 0.1, 5), "bits"),
        (lambda: encode(np.zeros(3), 0.0, 8), "eps"),
        (lambda: encode(np.array([np.nan]), 0.1, 8), "does not fit"),
        (lambda: encode(np.array([1e30]), 1e-6, 8), "does not fit"),
        (lambda: decode_point(np.zeros(3, dtype=np.uint8), 0.1, 8, np.zeros(4)), "shape"),
        (lambda: spacing_for(1.0, 8, safety=1.0), "safety"),
    ],
)
def test_bad_arguments_are_rejected(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_the_error_is_relative_to_the_reference_distance_not_to_the_vector_size() -> None:
    x = np.full(16, 1e4) + np.linspace(0, 1, 16)
    y = x + 0.01  # the receiver's model: huge values, close to the sender's
    eps = spacing_for(0.01, 8, safety=2.0)
    out = decode(encode(x, eps, 8), y)
    assert out.ok
    assert np.abs(out.values - x).max() <= 0.01 * 2 / 255 * (1 + ROUNDING_TOLERANCE)


def test_a_spacing_too_small_for_the_reference_fails_the_decode_instead_of_raising() -> None:
    """Found by the fuzzer: a hostile sender's eps of 1e-300 put ``reference / eps`` beyond int64."""
    sent = encode(np.zeros(4), 0.1, 8)
    hostile = type(sent)(codes=sent.codes, bits=8, eps=1e-300, checksum=sent.checksum)
    reference = np.linspace(-1.0, 1.0, 4)
    with np.errstate(all="raise"):  # and no numpy warnings on the way
        out = decode(hostile, reference)
    assert not out.ok and np.array_equal(out.values, reference)
    with pytest.raises(ValueError, match="not finite"):
        decode(sent, np.array([0.0, np.inf, 0.0, 0.0]))  # the receiver's own vector: a bug, raised
