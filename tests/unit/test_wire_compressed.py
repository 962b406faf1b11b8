"""Compressed payloads on the wire: hostile, truncated and inconsistent bytes are all a WireError with a reason."""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squall.training.compress import SCHEMAS, DenseFloat32, LatticeCompressor
from squall.wire import (
    ArraySpec,
    CompressedPayload,
    Message,
    ParamKind,
    PayloadSchema,
    WireError,
    WireLimits,
    compressed_from_message,
    pack_compressed,
    unpack_compressed,
    wire_size,
)
from squall.wire.compressed import pack_fields

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIXED = struct.Struct("<BBB5sQ")

#: A Top-K-shaped schema (what an upcoming compressor will register): k values and k indices below numel.
SPARSE = PayloadSchema(
    compressor="sparse-test",
    params=(("k", ParamKind.U64),),
    arrays=(
        ArraySpec("values", np.dtype(np.float32), count=lambda numel, p: int(p["k"])),
        ArraySpec("indices", np.dtype(np.int32), count=lambda numel, p: int(p["k"]), bound=lambda numel, p: numel),
    ),
)
ALL = {**SCHEMAS, SPARSE.compressor: SPARSE}


def lattice_bytes(numel: int = 5, bits: int = 4) -> bytes:
    x = np.linspace(-1, 1, numel)
    compressor = LatticeCompressor(bits=bits, eps=0.01)
    return pack_compressed(compressor.encode(x), compressor.schema)


def sparse(indices: list[int], numel: int = 10) -> bytes:
    values = np.ones(len(indices), dtype=np.float32)
    params = [(ParamKind.U64, len(indices))]
    return pack_fields("sparse-test", numel, params, [values, np.array(indices, dtype=np.int32)])


def test_valid_payloads_round_trip_with_their_parameters_and_arrays() -> None:
    got = unpack_compressed(lattice_bytes(), SCHEMAS)
    assert (got.compressor, got.numel, list(got.params), list(got.arrays)) == (
        "lattice",
        5,
        ["bits", "eps", "checksum"],
        ["codes"],
    )
    assert got.params["bits"] == 4 and got.params["eps"] == 0.01 and got.arrays["codes"].size == 3
    back = unpack_compressed(sparse([0, 9, 3]), ALL)
    np.testing.assert_array_equal(back.arrays["indices"], [0, 9, 3])
    assert len(sparse([0, 9, 3])) == wire_size(SPARSE, [3, 3])


@pytest.mark.parametrize("data", [lattice_bytes(), lattice_bytes(6, 8), sparse([1, 2])], ids=["l4", "l8", "sparse"])
def test_every_truncation_and_any_trailing_byte_is_rejected(data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(WireError):
            unpack_compressed(data[:cut], ALL)
    with pytest.raises(WireError, match="after the last array"):
        unpack_compressed(data + b"\x00", ALL)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (FIXED.pack(7, 3, 1, b"\x00\x00\x00\x00\x01", 5) + lattice_bytes()[16:], "reserved"),
        (FIXED.pack(0, 0, 0, bytes(5), 0), "claims id of 0 bytes"),
        (FIXED.pack(33, 0, 0, bytes(5), 0) + b"a" * 33, "claims id of 33 bytes"),
        (FIXED.pack(5, 17, 0, bytes(5), 0) + b"dense", "17 params"),
        (FIXED.pack(5, 0, 1, bytes(5), 1 << 40) + b"dense", "exceeds the limit"),
        (pack_fields("nosuch", 1, [], []), "unknown compressor id 'nosuch'"),
        (pack_fields("DENSE", 0, [], [np.zeros(0, np.float32)]), "unknown compressor id 'DENSE'"),
        (FIXED.pack(5, 0, 1, bytes(5), 0) + b"d\xffnse" + struct.pack("<BQ", 2, 0), "unknown compressor id"),
        (pack_fields("dense", 1, [], []), "0 arrays, the schema has 1"),
        (pack_fields("dense", 2, [], [np.zeros(2, np.float64)]), "dtype code 1, expected float32"),
        (pack_fields("dense", 3, [], [np.zeros(2, np.float32)]), "holds 2 elements, needs 3"),
        (pack_fields("dense", 1, [], [np.array([np.inf], np.float32)]), "non-finite"),
        (pack_fields("lattice", 2, [(ParamKind.U64, 8), (ParamKind.F64, 0.1)], []), "2 parameters, the schema has 3"),
        (
            pack_fields("lattice", 1, [(ParamKind.F64, 8), (ParamKind.F64, 0.1), (ParamKind.U64, 0)], []),
            "parameter 'bits' has kind 3, expected 1",
        ),
        (
            pack_fields("lattice", 1, [(ParamKind.U64, 8), (ParamKind.F64, np.nan), (ParamKind.U64, 0)], []),
            "'eps' is not finite",
        ),
        (
            pack_fields("lattice", 1, [(ParamKind.U64, 16), (ParamKind.F64, 0.1), (ParamKind.U64, 0)], []),
            "bits must be one of",
        ),
        (
            pack_fields(
                "lattice",
                3,
                [(ParamKind.U64, 4), (ParamKind.F64, 0.1), (ParamKind.U64, 0)],
                [np.array([0, 0xF0], np.uint8)],
            ),
            "padding nibble",
        ),
        (sparse([0, 10]), r"values in \[0, 10\], outside \[0, 10\)"),
        (sparse([-1, 3]), r"values in \[-1, 3\], outside \[0, 10\)"),
        (
            pack_fields("sparse-test", 10, [(ParamKind.U64, 2)], [np.ones(2, np.float32), np.array([1], np.int32)]),
            "'indices' holds 1 elements, needs 2",
        ),
    ],
)
def test_inconsistent_payloads_are_rejected_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        unpack_compressed(data, ALL)


def test_limits_bound_the_claimed_vector() -> None:
    data = pack_compressed(DenseFloat32().encode(np.zeros(100)), DenseFloat32.schema)
    unpack_compressed(data, SCHEMAS, limits=WireLimits(max_message_bytes=100))
    with pytest.raises(WireError, match="exceeds the limit"):
        unpack_compressed(data, SCHEMAS, limits=WireLimits(max_message_bytes=99))


def test_packing_runs_the_receivers_checks_before_anything_is_sent() -> None:
    schema = DenseFloat32.schema
    with pytest.raises(WireError, match="non-finite"):
        pack_compressed(CompressedPayload("dense", 1, {}, {"values": np.array([np.nan], np.float32)}), schema)
    with pytest.raises(WireError, match="packed with the schema"):
        pack_compressed(CompressedPayload("lattice", 1, {}, {}), schema)
    with pytest.raises(WireError, match="arrays"):
        pack_compressed(CompressedPayload("dense", 1, {}, {"vals": np.zeros(1, np.float32)}), schema)
    with pytest.raises(WireError, match="parameters"):
        pack_compressed(CompressedPayload("dense", 1, {"eps": 0.1}, {"values": np.zeros(1, np.float32)}), schema)
    with pytest.raises(WireError, match="does not fit"):
        pack_fields("lattice", 1, [(ParamKind.U64, -1)], [])
    with pytest.raises(ValueError, match="compressor id"):
        PayloadSchema(compressor="Top K", params=(), arrays=())


def test_a_compressed_message_is_a_1d_uint8_tensor() -> None:
    with pytest.raises(WireError, match="1-d uint8"):
        compressed_from_message(Message.of_tensor(torch.zeros(4)), SCHEMAS)
    with pytest.raises(WireError, match="1-d uint8"):
        compressed_from_message(Message.of_tensor(torch.zeros(2, 8, dtype=torch.uint8)), SCHEMAS)


@SETTINGS
@given(st.binary(max_size=96))
def test_random_bytes_are_a_payload_or_a_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        unpack_compressed(data, ALL)


@SETTINGS
@given(st.integers(0, 59), st.integers(0, 255))
def test_any_single_byte_change_is_a_valid_payload_or_a_wire_error(position: int, value: int) -> None:
    data = bytearray(lattice_bytes(41, 8))
    data[position % len(data)] = value
    try:
        payload = unpack_compressed(bytes(data), ALL)
    except WireError:
        return
    assert payload.compressor in ALL and payload.arrays["codes"].size == payload.numel  # still self-consistent
