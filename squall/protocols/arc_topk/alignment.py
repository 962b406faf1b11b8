"""T6.1 check 1 over a transport: do ``n`` workers with different gradients select the same rows?

Each worker runs the protocol's own compressed all-reduce (:func:`squall.collectives.allreduce` with the
:class:`~squall.training.compress.ArcTopK` compression of its :class:`~squall.protocols.arc_topk.sgd.ArcConfig`:
its own draw of the sketch from the shared seed, the ring all-reduce of the sketches, the selection) on
an in-process mesh; the rows each worker packed are read back from its local compressed vector.
"""

from __future__ import annotations

import numpy as np
import torch

from squall.collectives import allreduce, run_inproc
from squall.protocols.arc_topk.sgd import ArcConfig
from squall.transport import Transport


def distinct_selections(*, workers: int = 8, rows: int = 64, cols: int = 16, ratio: float = 0.125, rank: int = 4,
                        steps: int = 5, seed: int = 0) -> int:
    """The largest number of distinct row sets the workers selected at one of ``steps`` steps (1: aligned)."""
    rng = np.random.default_rng(seed)
    config = ArcConfig(ratio=ratio, rank=rank, cols=cols, seed=seed)
    compression = config.compression(rows * cols)
    worst = 0
    for step in range(steps):
        grads = [torch.from_numpy(rng.standard_normal(rows * cols).astype(np.float32)) for _ in range(workers)]

        async def one(transport: Transport, grads: list[torch.Tensor] = grads, step: int = step) -> tuple[int, ...]:
            local = torch.empty(rows * cols)
            await allreduce(transport, grads[transport.rank], round=step, op="mean", compression=compression,
                            local=local)
            return tuple(np.flatnonzero(local.view(rows, cols).abs().sum(dim=1).numpy()).tolist())

        worst = max(worst, len(set(run_inproc(workers, one))))
    return worst
