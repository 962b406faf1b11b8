"""FP4 E3M0 (Streaming DiLoCo's outer gradients): levels, scaling, both roundings, the payload's validation."""

from __future__ import annotations

import numpy as np
import pytest

from squall.training.compress import COMPRESSORS, SCHEMAS, Fp4E3M0
from squall.training.compress.fp4 import LEVELS, SIGN, decode_codes, encode_codes
from squall.training.compress.lattice import pack_codes
from squall.wire import CompressedPayload, WireError, pack_compressed, unpack_compressed


def round_trip(x: np.ndarray, **kw: object) -> np.ndarray:
    fp4 = Fp4E3M0(**kw)  # type: ignore[arg-type]
    data = pack_compressed(fp4.encode(x), fp4.schema)
    payload = unpack_compressed(data, SCHEMAS)
    return Fp4E3M0.for_payload(payload).decode(payload).values


def test_levels_are_zero_and_seven_powers_of_two() -> None:
    assert list(LEVELS) == [0.0] + [2.0**-e for e in range(6, -1, -1)]
    x = np.array([1.0, -0.5, 0.25, 2.0**-6, 0.0, -1.0], dtype=np.float32)
    assert np.array_equal(round_trip(x, group=6), x)  # every level is exact


def test_nearest_rounds_to_the_nearest_level_of_each_groups_absmax_scale() -> None:
    x = np.array([4.0, 2.9, 3.1, 1.4, 0.04, 0.02, -4.0, -1.6], dtype=np.float32)  # scale 4
    assert np.array_equal(round_trip(x, group=8), [4.0, 2.0, 4.0, 1.0, 0.0625, 0.0, -4.0, -2.0])
    y = np.linspace(-3, 3, 1000).astype(np.float32)
    err = np.abs(round_trip(y, group=100) - y)
    scales = np.repeat(np.abs(y).reshape(10, 100).max(axis=1), 100)
    assert np.all(err <= scales / 4 + 1e-7)


def test_stochastic_rounding_is_unbiased() -> None:
    x = np.full(200_000, 0.3, dtype=np.float32)
    x[0] = 1.0  # the scale
    out = round_trip(x, group=len(x), rounding="stochastic", seed=4)
    assert set(np.unique(out[1:])) == {0.25, 0.5}
    assert abs(out[1:].mean() - 0.3) < 3 * 0.125 / np.sqrt(len(x))  # 3 standard errors


def test_wire_bytes_are_half_a_byte_a_value_plus_a_float_a_group() -> None:
    fp4 = Fp4E3M0(group=128)
    for numel in (1, 127, 128, 1001):
        payload = pack_compressed(fp4.encode(np.ones(numel, dtype=np.float32)), fp4.schema)
        assert len(payload) == fp4.wire_bytes(numel)
    assert fp4.wire_bytes(128 * 1000) - 128 * 1000 // 2 - 4 * 1000 < 64
    assert "fp4_e3m0" in COMPRESSORS


def test_zeros_and_non_finite_input() -> None:
    assert np.array_equal(round_trip(np.zeros(5, dtype=np.float32)), np.zeros(5))
    with pytest.raises(ValueError, match="not finite"):
        Fp4E3M0().encode(np.array([1.0, np.nan]))


def _payload(codes: list[int], scales: list[float], group: int = 4) -> bytes:
    raw = CompressedPayload("fp4_e3m0", len(codes), {"group": group},
                            {"codes": pack_codes(np.array(codes, dtype=np.uint8), 4),
                             "scales": np.array(scales, dtype=np.float32)})
    return pack_compressed(raw, Fp4E3M0.schema, check=False)


@pytest.mark.parametrize(("codes", "scales", "group", "why"), [
    ([1, 2, 3], [1.0], 4, None),
    ([1, SIGN, 3], [1.0], 4, "negative-zero"),
    ([1, 2, 3], [-1.0], 4, "negative or not finite"),
    ([1, 2, 3], [float("inf")], 4, "non-finite"),
    ([1, 2, 3], [1.0, 1.0], 4, "scales"),
    ([1, 2, 3], [1.0], 0, "group"),
])
def test_the_receiver_validates_the_payload(codes: list[int], scales: list[float], group: int,
                                            why: str | None) -> None:
    data = _payload(codes, scales, group)
    if why is None:
        payload = unpack_compressed(data, SCHEMAS)
        assert np.array_equal(Fp4E3M0().decode(payload).values, [2.0**-6, 2.0**-5, 2.0**-4])
        return
    with pytest.raises(WireError, match=why):
        unpack_compressed(data, SCHEMAS)


def test_nonzero_padding_nibble_is_rejected() -> None:
    data = bytearray(_payload([1, 2, 3], [1.0]))
    data[-5] |= 0x30  # the high nibble after the third code (the codes sit just before the 4-byte scale)
    with pytest.raises(WireError, match="padding"):
        unpack_compressed(bytes(data), SCHEMAS)


def test_codes_round_trip_through_decode() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(999).astype(np.float32)
    codes, scales = encode_codes(x, 64)
    assert codes.max() < 16 and not np.any(codes == SIGN)
    assert np.array_equal(decode_codes(codes, scales, 64), round_trip(x, group=64))
