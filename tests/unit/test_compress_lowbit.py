"""Low-bit all-reduce (docs/protocols/lowbit.md, T8.1): relative error of INT8/INT4, flat in the number of ranks for
the two-step, growing for the per-hop ring; bytes per rank against the table of docs/protocols/README.md; a peer's bad
payload is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from squall.collectives import CollectiveError, allreduce, run_inproc, sent_bytes
from squall.collectives.allgather import payload_message
from squall.collectives.requant import GATHER_TAG, SCATTER_TAG
from squall.protocols.lowbit.accuracy import relative_error
from squall.protocols.lowbit.sgd import RING, TWO_STEP
from squall.training.compress import GroupQuant
from squall.training.compress.quant import SCHEMA, quantize, to_payload
from squall.transport import Transport
from squall.wire import Message

HEADER = 48 + 16


@pytest.mark.parametrize(("bits", "limit"), [(8, 0.015), (4, 0.20)])
def test_t8_1_two_step_error_is_within_bounds_and_flat_in_the_ranks(bits: int, limit: float) -> None:
    errors = {p: relative_error(TWO_STEP, world=p, bits=bits, seed=p) for p in (2, 4, 16)}
    assert max(errors.values()) <= limit, errors
    assert errors[16] / errors[2] <= 1.2, errors  # two quantizations per element whatever p is


@pytest.mark.parametrize("bits", [8, 4])
def test_t8_1_the_per_hop_ring_error_grows_with_the_ranks(bits: int) -> None:
    errors = {p: relative_error(RING, world=p, bits=bits, seed=p) for p in (2, 16)}
    assert errors[16] / errors[2] >= 1.5, errors  # about sqrt(8.5 / 1.5) = 2.4
    assert errors[16] > relative_error(TWO_STEP, world=16, bits=bits, seed=16)


@pytest.mark.parametrize("schedule", ["two_step", "ring"])
@pytest.mark.parametrize("bits", [8, 4])
def test_bytes_per_rank_match_section_8_3_and_every_rank_gets_the_same_bits(schedule: str, bits: int) -> None:
    n, group = 4, 128
    numel = n * group * 32
    rng = np.random.default_rng(bits)
    inputs = [torch.from_numpy(rng.standard_normal(numel).astype(np.float32)) for _ in range(n)]
    quantizer = GroupQuant(bits=bits, group=group)

    async def one(transport: Transport) -> tuple[torch.Tensor, int]:
        out = await allreduce(transport, inputs[transport.rank], round=1, op="mean", compression=quantizer,
                              schedule=schedule)
        return out, transport.total_counters().bytes_sent

    results = run_inproc(n, one)
    assert all(torch.equal(results[0][0], out) for out, _ in results)
    segment = numel // n
    expected = 2 * (n - 1) * (HEADER + quantizer.wire_bytes(segment))
    assert [sent for _, sent in results] == [expected] * n
    assert expected == sent_bytes(numel, n, compression=quantizer, schedule=schedule)
    data = 2 * (n - 1) * segment * (bits / 8 + 4 / group)  # codes + fp16 scale and zero per group
    fp32 = 2 * (n - 1) * segment * 4  # the fp32 ring's
    assert data / fp32 == pytest.approx({8: 0.258, 4: 0.133}[bits], abs=0.001)
    assert expected - data == 2 * (n - 1) * (HEADER + quantizer.wire_bytes(0))  # headers only besides


@pytest.mark.parametrize(("n", "numel"), [(4, 650), (3, 1000), (5, 128 * 7 + 3)])
def test_bytes_per_rank_with_uneven_segments_follow_each_schedule(n: int, numel: int) -> None:
    rng = np.random.default_rng(numel)
    inputs = [torch.from_numpy(rng.standard_normal(numel).astype(np.float32)) for _ in range(n)]
    quantizer = GroupQuant(bits=4)
    for schedule in ("two_step", "ring"):

        async def one(transport: Transport, schedule: str = schedule) -> int:
            await allreduce(transport, inputs[transport.rank], round=0, op="mean", compression=quantizer,
                            schedule=schedule)
            return transport.total_counters().bytes_sent

        expected = [sent_bytes(numel, n, compression=quantizer, schedule=schedule, rank=rank) for rank in range(n)]
        assert run_inproc(n, one) == expected, schedule


def test_a_payload_with_the_wrong_group_metadata_fails_the_collective_naming_the_peer() -> None:
    n, group = 2, 128
    x = torch.ones(n * group * 2)

    async def one(transport: Transport) -> torch.Tensor | None:
        if transport.rank == 1:  # a peer that quantized its segment in groups of 64
            bad = to_payload(quantize(np.ones(group * 2, dtype=np.float32), 8, 64))
            await transport.send(0, payload_message(bad, SCHEMA, round=0, tag=SCATTER_TAG))
            await transport.send(0, Message.of_tensor(torch.zeros(1), round=0, tag=GATHER_TAG))
            return None
        return await allreduce(transport, x, round=0, op="mean", compression=GroupQuant(bits=8, group=group))

    wrong = "rank 1 quantized with 8 bits in groups of 64, expected 8 bits in groups of 128"
    with pytest.raises(CollectiveError, match=wrong):
        run_inproc(n, one)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="bits must be one of"):
        GroupQuant(bits=3)

    async def one(transport: Transport) -> torch.Tensor:
        return await allreduce(transport, torch.ones(4), round=0, op="max", compression=GroupQuant())

    with pytest.raises(ValueError, match="a compressed all-reduce takes 'sum' or 'mean'"):
        run_inproc(1, one)
