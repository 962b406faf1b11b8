"""myproto's tests: the averaging maths in process, then the protocol in containers on shaped links."""

from __future__ import annotations

import asyncio

import pytest
import torch
from myproto.protocol import PairAverage, partner_of

from squall.checks import Target, converged
from squall.transport import inproc_mesh


def test_partners_pair_up_every_step() -> None:
    for step in range(6):
        for rank in range(8):
            partner = partner_of(rank, step, 8)
            assert partner is not None and partner_of(partner, step, 8) == rank


def test_three_exchanges_average_eight_ranks_exactly() -> None:
    """With no gradient, log2(8) = 3 steps of pairwise averaging leave every rank on the mean."""

    async def run() -> list[torch.Tensor]:
        transports = inproc_mesh(8)
        algorithms = [PairAverage(t) for t in transports]
        params = [torch.full((3,), float(rank)) for rank in range(8)]
        for k in range(3):
            params = list(await asyncio.gather(*(
                a.step(k, x, torch.zeros(3), lr=0.1) for a, x in zip(algorithms, params, strict=True))))
        for t in transports:
            await t.close()
        return params

    for x in asyncio.run(run()):
        assert torch.equal(x, torch.full((3,), 3.5))


@pytest.mark.docker
@pytest.mark.squall(protocols=["myproto.protocol:main"],
                    profiles=["lan", "profiles/wan-30ms-2pct.yaml"],  # relative: this folder, then the rootdir
                    workers=4, seconds=20, target={"accuracy": 0.9}, config={"eval_every": 5})
def test_reaches_the_target_on_each_network(squall_trace, squall_check) -> None:  # type: ignore[no-untyped-def]
    assert squall_trace.backend in ("netem", "nfqueue")
    squall_check(converged(squall_trace, Target("accuracy", 0.85)))
