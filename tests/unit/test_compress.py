"""The compressor interface: round trips through the wire, exact wire bytes, guarantees checked numerically."""

from __future__ import annotations

import numpy as np
import pytest

from squall.training.compress import COMPRESSORS, SCHEMAS, Compressor, DenseFloat32, Guarantees, LatticeCompressor
from squall.training.compress.lattice import radius
from squall.wire import Message, compressed_from_message, compressed_message, pack_compressed, unpack_compressed

#: Lattice spacing of the round trips; references lie within INSIDE x radius of the vector.
EPS = 0.01
INSIDE = 0.9


def compressors() -> list[Compressor]:
    return [DenseFloat32(), LatticeCompressor(bits=4, eps=EPS), LatticeCompressor(bits=8, eps=EPS)]


def ids() -> list[str]:
    return ["dense", "lattice-4", "lattice-8"]


def through_the_wire(compressor: Compressor, x: np.ndarray) -> tuple[bytes, np.ndarray, bool]:
    """Encode, pack, send as a message, decode the frame, unpack, decode against a reference near x."""
    payload = compressor.encode(x)
    data = pack_compressed(payload, compressor.schema)
    message = compressed_message(payload, compressor.schema, round=3, tag=9)
    assert message.tensor is not None and message.tensor.numpy().tobytes() == data
    got = compressed_from_message(Message.of_tensor(message.tensor.clone()), SCHEMAS)
    rng = np.random.default_rng(5)
    reach = radius(EPS, 4) * INSIDE
    reference = x + rng.uniform(-reach, reach, size=x.shape)
    out = compressor.decode(got, reference=reference)
    return data, np.asarray(out.values, dtype=np.float64), out.ok


@pytest.mark.parametrize("numel", [0, 1, 2, 7, 650])
@pytest.mark.parametrize("compressor", compressors(), ids=ids())
def test_wire_bytes_are_exactly_the_packed_size(compressor: Compressor, numel: int) -> None:
    x = np.random.default_rng(numel).normal(size=numel)
    data, values, ok = through_the_wire(compressor, x)
    assert len(data) == compressor.wire_bytes(numel)
    assert ok and values.shape == (numel,)


@pytest.mark.parametrize("compressor", compressors(), ids=ids())
def test_decoded_vectors_stay_within_the_stated_error_bound(compressor: Compressor) -> None:
    x = np.random.default_rng(1).normal(size=1000)
    payload = compressor.encode(x)
    _, values, ok = through_the_wire(compressor, x)
    bound = compressor.error_bound(payload)
    assert ok
    assert np.abs(values - x).max() <= bound * (1 + 1e-9), (np.abs(values - x).max(), bound)


def test_the_dense_compressor_is_exact_for_float32_and_contracts_as_stated() -> None:
    compressor = DenseFloat32()
    x32 = np.random.default_rng(2).normal(size=500).astype(np.float32)
    _, values, _ = through_the_wire(compressor, x32)
    np.testing.assert_array_equal(values, x32)
    x = np.random.default_rng(3).normal(size=500) * 1e3  # float64: rounded to float32
    _, values, _ = through_the_wire(compressor, x)
    delta = compressor.guarantees.delta
    assert delta is not None
    assert float(np.sum((values - x) ** 2)) <= (1 - delta) * float(np.sum(x**2))
    with pytest.raises(ValueError, match="not finite"):
        compressor.encode(np.array([1e300]))  # beyond float32's range


def test_the_lattice_needs_a_reference_and_detects_one_too_far() -> None:
    compressor = LatticeCompressor(bits=4, eps=EPS)
    assert compressor.guarantees.needs_reference and not compressor.guarantees.unbiased
    x = np.random.default_rng(4).normal(size=64)
    payload = unpack_compressed(pack_compressed(compressor.encode(x), compressor.schema), SCHEMAS)
    with pytest.raises(ValueError, match="reference"):
        compressor.decode(payload)
    far = x + 2 * radius(EPS, 4)
    assert not compressor.decode(payload, reference=far).ok
    with pytest.raises(ValueError, match="cannot be decoded by 'dense'"):
        DenseFloat32().decode(payload)


def test_every_compressor_is_registered_under_its_wire_id_with_consistent_guarantees() -> None:
    assert set(COMPRESSORS) == set(SCHEMAS) >= {"dense", "lattice"}
    for name, cls in COMPRESSORS.items():
        assert cls.name == name == cls.schema.compressor
    with pytest.raises(ValueError, match="delta"):
        Guarantees(unbiased=True, contractive=False, delta=0.5, error_bound="none")
    with pytest.raises(ValueError, match="delta"):
        Guarantees(unbiased=True, contractive=True, delta=1.5, error_bound="none")
    with pytest.raises(ValueError, match="bits"):
        LatticeCompressor(bits=5, eps=EPS)
