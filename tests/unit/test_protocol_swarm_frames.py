"""SwarmSGD's messages, the per-interaction maths, graphs and options (pure parts, no transport)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from squall.protocols.swarm.averaging import QuantizerConfig, answer, full_precision, increment, offer, receive
from squall.protocols.swarm.frames import (
    HEADER,
    Frame,
    FrameError,
    FrameKind,
    frame_bytes,
    from_message,
    parse_frame,
    to_message,
)
from squall.protocols.swarm.options import SwarmOptions
from squall.protocols.swarm.schedule import choose_partner, local_steps, node_rng, random_regular_graph, swarm_graph
from squall.training.compress import LatticeCompressor
from squall.training.compress.lattice import Encoded, encode, quantize
from squall.training.options import read_options
from squall.wire import Message, ParamKind, decode_frame, encode_message
from squall.wire.compressed import pack_fields

DIM = 650  # logistic regression on digits
NO_RESERVED = bytes(7)


def lattice_body(numel: int, codes: bytes, *, bits: int = 8, eps: float = 0.1) -> bytes:
    """A lattice payload laid out as given, unchecked (for forging bad ones)."""
    params = [(ParamKind.U64, bits), (ParamKind.F64, eps), (ParamKind.U64, 0)]
    return pack_fields("lattice", numel, params, [np.frombuffer(codes, dtype=np.uint8)])


def dense_body(numel: int, values: list[float]) -> bytes:
    """A dense payload laid out as given, unchecked."""
    return pack_fields("dense", numel, [], [np.array(values, dtype=np.float32)])


def _roundtrip(frame: Frame) -> Frame:
    message = to_message(frame)
    return from_message(decode_frame(bytearray(encode_message(message, sender=3).tobytes())))


@pytest.mark.parametrize("bits", [4, 8])
def test_lattice_frames_cost_bits_over_32_of_float32_plus_a_fixed_header(bits: int) -> None:
    x = np.random.default_rng(0).normal(size=DIM)
    frame = Frame(FrameKind.OFFER, 17, encode(x, 0.01, bits))
    compressor = LatticeCompressor(bits=bits, eps=0.01)
    fixed = HEADER.size + compressor.wire_bytes(0)  # frame header + compressed payload header
    assert len(frame_bytes(frame)) == HEADER.size + compressor.wire_bytes(DIM) == fixed + (DIM * bits + 7) // 8
    assert len(frame_bytes(frame)) <= bits / 32 * DIM * 4 + fixed + 1
    back = _roundtrip(frame)
    assert back.kind is FrameKind.OFFER and back.exchange == 17
    assert isinstance(back.vector, Encoded) and isinstance(frame.vector, Encoded)
    np.testing.assert_array_equal(back.vector.codes, frame.vector.codes)
    assert (back.vector.eps, back.vector.checksum, back.vector.bits) == (0.01, frame.vector.checksum, bits)


def test_raw_and_empty_frames_round_trip() -> None:
    raw = np.arange(5, dtype=np.float32)
    back = _roundtrip(Frame(FrameKind.ANSWER, 2**40, raw))
    assert isinstance(back.vector, np.ndarray)
    np.testing.assert_array_equal(back.vector, raw)
    for kind in (FrameKind.BUSY, FrameKind.RESEND, FrameKind.REACHED, FrameKind.DONE, FrameKind.HELLO):
        assert _roundtrip(Frame(kind, 5)) == Frame(kind, 5)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x01", "shorter than"),
        (HEADER.pack(9, NO_RESERVED), "unknown frame kind"),
        (HEADER.pack(3, b"\x01" + bytes(6)), "reserved"),
        (HEADER.pack(3, NO_RESERVED) + lattice_body(1, b"\x00"), "carries no vector"),
        (HEADER.pack(1, NO_RESERVED) + lattice_body(1, b"\x00", bits=7), "bits must be"),
        (HEADER.pack(1, NO_RESERVED) + lattice_body(2, b"\x00"), "'codes' holds 1 elements, needs 2"),
        (HEADER.pack(1, NO_RESERVED) + lattice_body(1, b"\x00", eps=-1.0), "spacing"),
        (HEADER.pack(1, NO_RESERVED) + lattice_body(1, b"\xf0", bits=4), "padding"),
        (HEADER.pack(1, NO_RESERVED) + dense_body(2, [0.0]), "'values' holds 1 elements, needs 2"),
        (HEADER.pack(2, NO_RESERVED) + dense_body(1, [float("nan")]), "non-finite"),
        (
            HEADER.pack(2, NO_RESERVED) + pack_fields("dense", 0, [(ParamKind.F64, 0.1)], [np.zeros(0, np.float32)]),
            "1 parameters, the schema has 0",
        ),  # a raw vector carries no eps or checksum
        (HEADER.pack(1, NO_RESERVED) + pack_fields("topk", 1, [], []), "unknown compressor id 'topk'"),
        (HEADER.pack(1, NO_RESERVED) + lattice_body(2, b"\x00\x00")[:-1], "cut short"),
    ],
)
def test_malformed_frames_are_rejected(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        parse_frame(data, exchange=0)


def test_a_frame_must_be_a_uint8_tensor_and_carry_a_vector_exactly_when_its_kind_says() -> None:
    with pytest.raises(FrameError, match="uint8"):
        from_message(Message.of_tensor(torch.zeros(3)))
    with pytest.raises(FrameError, match="needs a vector"):
        Frame(FrameKind.OFFER, 0)
    with pytest.raises(FrameError, match="cannot carry"):
        Frame(FrameKind.DONE, 0, np.zeros(1, dtype=np.float32))


def test_an_answer_always_decodes_even_when_a_fixed_eps_is_too_fine() -> None:
    rng = np.random.default_rng(1)
    reference = rng.normal(size=DIM).astype(np.float32)
    far = reference + 5.0
    for config in (QuantizerConfig(bits=4), QuantizerConfig(bits=8), QuantizerConfig(bits=4, eps=1e-3)):
        out, distance = answer(far, config, reference)
        assert distance == pytest.approx(5.0, rel=1e-5)
        got = receive(out.vector, reference)
        assert got.point is not None
        np.testing.assert_array_equal(got.point, out.point)
    fine, _ = answer(far, QuantizerConfig(bits=4, eps=1e-3), reference)
    assert not isinstance(fine.vector, Encoded)  # fell back to full precision


def test_offers_start_in_full_precision_and_quantize_once_a_distance_is_known() -> None:
    x = np.ones(8, dtype=np.float32)
    assert not isinstance(offer(x, QuantizerConfig(), None, 2.0).vector, Encoded)
    assert isinstance(offer(x, QuantizerConfig(), 0.5, 2.0).vector, Encoded)
    assert isinstance(offer(x, QuantizerConfig(eps=0.1), None, 2.0).vector, Encoded)
    assert not isinstance(offer(x, QuantizerConfig(bits=32), 0.5, 2.0).vector, Encoded)
    out = offer(x * 0.3, QuantizerConfig(eps=0.1), None, 2.0)
    np.testing.assert_array_equal(out.point, quantize(x * 0.3, 0.1).astype(np.float32))


def test_the_two_increments_of_an_interaction_cancel_exactly() -> None:
    rng = np.random.default_rng(2)
    a, b = (rng.normal(size=DIM).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(increment(a, b), -increment(b, a))
    x_i, x_j = a + 0.25, b - 1.0  # the models moved on while the messages travelled
    before = x_i.astype(np.float64) + x_j
    after = (x_i + increment(b, a)).astype(np.float64) + (x_j + increment(a, b))
    assert np.abs(after - before).max() < 1e-5
    np.testing.assert_array_equal(full_precision(a).point, a)


@pytest.mark.parametrize(("n", "degree"), [(8, 4), (16, 3), (10, 6), (4, 2), (30, 5)])
def test_random_regular_graphs_are_regular_connected_simple_and_seeded(n: int, degree: int) -> None:
    graph = random_regular_graph(n, degree, seed=7)
    assert (graph.degrees() == degree).all()
    assert graph.is_connected()
    assert random_regular_graph(n, degree, seed=7) == graph
    assert len({random_regular_graph(n, degree, seed=s).edges for s in range(5)}) > 1 or n == 4


def test_swarm_graph_names_and_limits() -> None:
    assert swarm_graph("random_regular", 4, degree=4).edges == swarm_graph("complete", 4).edges
    assert (swarm_graph("random_regular", 7, degree=3).degrees() == 2).all()  # odd n: the even degree below
    assert (swarm_graph("torus", 8).degrees() == 3).all()  # 2 x 4 torus: the 2-ring doubles up
    with pytest.raises(ValueError, match="unknown topology"):
        swarm_graph("star", 8)
    with pytest.raises(ValueError, match="even"):
        random_regular_graph(5, 3, seed=0)


def test_local_steps_are_geometric_with_the_given_mean_and_partners_uniform() -> None:
    rng = node_rng(0, 1, stream=1)
    draws = [local_steps(rng, 3.0) for _ in range(20000)]
    assert min(draws) == 1
    assert np.mean(draws) == pytest.approx(3.0, rel=0.05)  # s.e. of the mean about 0.017 (0.6 %)
    assert local_steps(rng, 3.0, geometric=False) == 3
    partners = [choose_partner(rng, [2, 5, 9]) for _ in range(3000)]
    assert {p: partners.count(p) for p in (2, 5, 9)} == pytest.approx({2: 1000, 5: 1000, 9: 1000}, abs=150)
    assert choose_partner(rng, []) is None


def test_options_from_json_validate() -> None:
    options = read_options(SwarmOptions, {"bits": 4, "topology": "torus", "local_steps": 2, "eps": 0.01},
                           where="swarm options")
    assert options.quantizer == QuantizerConfig(bits=4, eps=0.01)
    assert (options.topology, options.local_steps) == ("torus", 2.0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bitz'\]; allowed: \['topology'"):
        read_options(SwarmOptions, {"bitz": 4}, where="swarm options")
    with pytest.raises(ValueError, match="bits"):
        read_options(SwarmOptions, {"bits": 16}, where="swarm options")
    with pytest.raises(ValueError, match="local_steps"):
        read_options(SwarmOptions, {"local_steps": 0.5}, where="swarm options")
