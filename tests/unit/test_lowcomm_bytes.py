"""Bytes on the wire of the low-communication family, counted by the in-process transport, against their exact
formulas (LOW-COMMUNICATION section 5, item 1): DiLoCo sends DDP's bytes once every H steps; Streaming DiLoCo
sends one fragment per event (1/F of DiLoCo's vector, at FP4's size); SPARTA a ring of round(pP) values;
DeMo its pairs to each of the n - 1 others; an emulated payload pads every message to the emulated model."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from squall.collectives import run_inproc, sent_bytes
from squall.lowcomm.average import Averager, frame_bytes
from squall.protocols.demo.optimizer import DeMo
from squall.protocols.demo.wire import payload_bytes
from squall.protocols.diloco.outer import DdpAdamW, DiLoCo
from squall.protocols.sparta.sparse import Sparta, subset_size
from squall.protocols.streaming_diloco.outer import StreamingDiLoCo
from squall.training.algorithms.base import Algorithm
from squall.training.compress import Fp4E3M0
from squall.training.optim import AdamW
from squall.training.payload import Payload
from squall.transport import Transport

N = 4
SHAPES = ((96, 64), (64,), (64, 160), (160,))  # a 2-layer MLP's tensors
NUMEL = sum(torch.Size(s).numel() for s in SHAPES)


def sent_per_step(build: Callable[[Transport], Algorithm], steps: int) -> list[list[int]]:
    """Bytes each rank sent at each step (random gradients; the bytes do not depend on them)."""
    torch.manual_seed(1)
    grads = [[torch.randn(NUMEL) for _ in range(N)] for _ in range(steps)]

    async def one(transport: Transport) -> list[int]:
        algorithm = build(transport)
        algorithm.bind_tensors(SHAPES)
        x, out = torch.zeros(NUMEL), []
        for k in range(steps):
            before = transport.total_counters().bytes_sent
            x = await algorithm.step(k, x, grads[k][transport.rank], 0.01)
            out.append(transport.total_counters().bytes_sent - before)
        await algorithm.finish(x)  # settles what is in flight (not counted)
        return out

    return run_inproc(N, one)


def ring_bytes_sent(numel: int, itemsize: int, n: int, rank: int = 0) -> int:
    """The exact ring's bytes, by the collectives' own formula."""
    return sent_bytes(numel, n, rank=rank, dtype={4: torch.float32, 2: torch.bfloat16}[itemsize])


def test_ring_formula_is_two_n_minus_1_over_n_of_the_vector_plus_64_bytes_a_message() -> None:
    assert ring_bytes_sent(1000, 4, N) == 2 * (N - 1) * (1000 // N * 4 + 64)  # one message per segment
    big = 3 << 20  # 12 MiB of float32: segments of 3 MiB in chunks of 1 MiB
    assert ring_bytes_sent(big, 4, N) == 2 * (N - 1) * (big // N * 4 + 3 * 64)
    assert ring_bytes_sent(1000, 2, N) == 2 * (N - 1) * (1000 // N * 2 + 64)
    assert ring_bytes_sent(10, 4, 1) == 0


def test_diloco_sends_ddps_bytes_once_every_h_steps() -> None:
    h, steps = 4, 8
    ddp = sent_per_step(lambda t: DdpAdamW(Averager(t), inner=AdamW()), steps)
    diloco = sent_per_step(lambda t: DiLoCo(Averager(t), sync_every=h, inner=AdamW()), steps)
    for rank in range(N):
        assert ddp[rank] == [ring_bytes_sent(NUMEL, 4, N, rank)] * steps
        assert diloco[rank] == [0, 0, 0, ddp[rank][0]] * (steps // h)
        assert sum(ddp[rank]) == h * sum(diloco[rank])  # the ratio is exactly H


@pytest.mark.parametrize("overlap", [0, 1])
def test_streaming_sends_one_fp4_fragment_per_event(overlap: int) -> None:
    h, f, steps = 4, 2, 8
    sent = sent_per_step(lambda t: StreamingDiLoCo(Averager(t, compression=Fp4E3M0()), sync_every=h, fragments=f,
                                                   overlap=overlap, inner=AdamW(), sync_at_end=False), steps)
    half = NUMEL // 2  # no block names: two contiguous halves
    event = [sent_bytes(half, N, compression=Fp4E3M0(), rank=rank) for rank in range(N)]
    for rank in range(N):
        if overlap == 0:  # events after 4, 6 and 8 steps
            assert sent[rank] == [0, 0, 0, event[rank], 0, event[rank], 0, event[rank]]
        else:  # the messages leave while the next step's await runs: the last one after the loop
            assert sum(sent[rank]) == 2 * event[rank]
    dense = ring_bytes_sent(NUMEL, 4, N)
    assert max(event) / dense < 1 / f * 0.55 / 4 + 0.01  # 1/F of the vector, at 0.53 of 4 bytes per value


def test_sparta_sends_a_ring_of_round_p_p_values() -> None:
    sent = sent_per_step(lambda t: Sparta(Averager(t), inner=AdamW(), fraction=0.01), 3)
    k = subset_size(NUMEL, 0.01)
    assert k == round(0.01 * NUMEL)
    for rank in range(N):
        assert sent[rank] == [ring_bytes_sent(k, 4, N, rank)] * 3


def test_demo_sends_its_pairs_to_every_other_replica() -> None:
    sent = sent_per_step(lambda t: DeMo(t, k=8, chunk=32), 2)
    pairs = 96 // 32 * 64 // 32 * 8 + 64 // 32 * 8 + 64 // 32 * 160 // 32 * 8 + 160 // 32 * 8
    assert sent == [[(N - 1) * frame_bytes(payload_bytes(pairs))] * 2] * N
    assert payload_bytes(pairs) - 8 * pairs < 64  # int32 index and float32 value per pair, a small header


@pytest.mark.parametrize(("dtype", "itemsize"), [("fp32", 4), ("bf16", 2)])
def test_payload_pads_every_message_to_the_emulated_model(dtype: str, itemsize: int) -> None:
    payload = Payload(params=10 * NUMEL, dtype=dtype)
    ddp = sent_per_step(lambda t: DdpAdamW(Averager(t, payload=payload), inner=AdamW()), 2)
    assert ddp[0] == [ring_bytes_sent(10 * NUMEL, itemsize, N, 0)] * 2
    sparta = sent_per_step(lambda t: Sparta(Averager(t, payload=payload), inner=AdamW(), fraction=0.01), 1)
    assert sparta[0] == [ring_bytes_sent(10 * subset_size(NUMEL, 0.01), itemsize, N, 0)]


def test_padding_does_not_change_the_maths() -> None:
    torch.manual_seed(2)
    vectors = [torch.randn(1000) for _ in range(N)]

    async def one(transport: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        plain = await Averager(transport).mean(vectors[transport.rank], 0)
        padded = Averager(transport, payload=Payload(params=5000))
        padded.bind_model(1000)
        return plain, await padded.mean(vectors[transport.rank], 1)

    exact = torch.stack(vectors).double().mean(0)
    results = run_inproc(N, one)
    for plain, padded in results:  # the segments move, so the ring adds in another order: equal to rounding
        assert float((padded.double() - exact).abs().max()) < 1e-6
        assert float((plain.double() - exact).abs().max()) < 1e-6
        assert torch.equal(padded, results[0][1])
