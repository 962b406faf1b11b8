"""DeMo's step: decoupled momentum, chunked DCT top-k with error feedback, all-gather, sign update."""

from __future__ import annotations

from typing import Any

import torch

from squall.collectives.allgather import allgather_compressed
from squall.lowcomm import frame_bytes
from squall.protocols.demo.dct import Plan, dct, idct, plan, scatter, top_k
from squall.protocols.demo.wire import SCHEMA, check_indices, chunk_limits, payload_bytes, payload_of
from squall.training.algorithms.base import Algorithm, Shapes
from squall.transport import Transport

#: Tag of DeMo's all-gather ("DEMO").
DEMO_TAG = 0x44454D4F


class DeMo(Algorithm):
    """Decoupled momentum optimisation (see the package docstring).

    :param beta: the momentum's decay (0.999, the authors' setting).
    :param k: coefficients kept per chunk (32).
    :param chunk: largest chunk side (64).
    :param weight_decay: decoupled weight decay (0).
    :param timeout: deadline of each send and receive (None: the transport's default).
    """

    name = "demo"

    def __init__(self, transport: Transport, *, beta: float = 0.999, k: int = 32, chunk: int = 64,
                 weight_decay: float = 0.0, timeout: float | None = None) -> None:
        super().__init__()
        if not 0 <= beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if k < 1 or chunk < 1:
            raise ValueError(f"k and chunk must be >= 1, got {k} and {chunk}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.transport, self.beta, self.k, self.chunk = transport, beta, k, chunk
        self.weight_decay, self.timeout = weight_decay, timeout
        self.shapes: Shapes | None = None
        self.plans: tuple[Plan, ...] = ()
        self.delta: torch.Tensor | None = None  # the momentum, this replica's own
        self._limits: Any = None
        self.entries = 0
        self.steps = 0

    def bind_tensors(self, shapes: Shapes) -> None:
        self.shapes = shapes

    def _setup(self, numel: int) -> None:
        shapes = self.shapes or ((numel,),)
        self.plans = tuple(plan(s, chunk=self.chunk, k=self.k) for s in shapes)
        if sum(p.numel for p in self.plans) != numel:
            raise ValueError(f"the tensors' shapes cover {sum(p.numel for p in self.plans)} of {numel} parameters")
        self._limits = chunk_limits(self.plans)
        self.entries = sum(p.entries for p in self.plans)

    def compress(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every tensor's kept (indices, values), concatenated, and what they stand for (flat)."""
        indices, values, sent, offset = [], [], [], 0
        for p in self.plans:
            coeffs = dct(delta[offset:offset + p.numel], p)
            index, value = top_k(coeffs, p.keep)
            indices.append(index.reshape(-1))
            values.append(value.reshape(-1))
            sent.append(idct(scatter(index, value, p), p))
            offset += p.numel
        return torch.cat(indices), torch.cat(values), torch.cat(sent)

    def decode_mean(self, gathered: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """``U``: each coefficient averaged over the replicas that sent it, then the inverse DCT (flat)."""
        out, pair = [], 0
        for p in self.plans:
            total = torch.zeros(p.tiles, p.tile)
            count = torch.zeros(p.tiles, p.tile)
            for index, value in gathered:  # rank order: every replica adds alike
                i = index[pair:pair + p.entries].view(p.tiles, p.keep).to(torch.int64)
                v = value[pair:pair + p.entries].view(p.tiles, p.keep)
                total.scatter_add_(1, i, v)
                count.scatter_add_(1, i, torch.ones_like(v))
            out.append(idct(torch.where(count > 0, total / count.clamp(min=1), 0.0), p))
            pair += p.entries
        return torch.cat(out)

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self.delta is None:
            self._setup(params.numel())
            self.delta = torch.zeros_like(params)
        theta = params * (1 - lr * self.weight_decay) if self.weight_decay else params.clone()
        self.delta.mul_(self.beta).add_(grad, alpha=lr)
        index, value, sent = self.compress(self.delta)
        self.delta.sub_(sent)
        tile, keep = max(p.tile for p in self.plans), max(p.keep for p in self.plans)
        payloads = await allgather_compressed(self.transport, payload_of(index, value, k=keep, tile=tile), SCHEMA,
                                              round=k, tag=DEMO_TAG, timeout=self.timeout)
        gathered = []
        for sender, payload in enumerate(payloads):
            check_indices(payload, self._limits, sender=sender)
            gathered.append((torch.tensor(payload.arrays["indices"]), torch.tensor(payload.arrays["values"])))
        self.steps += 1
        return theta.sub_(self.decode_mean(gathered).sign_(), alpha=lr)

    def bytes_sent(self) -> int:
        """Exact bytes a replica sends per step: its payload to each of the ``n - 1`` others."""
        n = self.transport.world_size
        return (n - 1) * frame_bytes(payload_bytes(self.entries)) if n > 1 else 0

    def stats(self) -> dict[str, Any]:
        return {"demo_pairs": self.entries, "avg_every": 1, "overlap_steps": 0, "avg_calls": self.steps,
                "avg_bytes_total": self.steps * self.bytes_sent(), "avg_bytes": self.bytes_sent(),
                "avg_wire_bytes": payload_bytes(self.entries),
                "avg_link_bytes": frame_bytes(payload_bytes(self.entries)),
                "avg_hops": 1 if self.transport.world_size > 1 else 0}
