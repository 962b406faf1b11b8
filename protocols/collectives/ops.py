"""Reduction operators of the collectives, and the checks every received piece goes through.

``sum``, ``max`` and ``min`` are combined elementwise as pieces arrive; ``mean`` is a ``sum``
followed by one division by ``n``. Every combination used here is commutative elementwise in
IEEE arithmetic (``a + b`` and ``b + a`` round to the same value), which is why ranks that
combine the same two operands in opposite roles still hold identical bits.
"""

from __future__ import annotations

from typing import Literal

import torch

from protocols.wire import Message

ReduceOp = Literal["sum", "mean", "max", "min"]
REDUCE_OPS: tuple[ReduceOp, ...] = ("sum", "mean", "max", "min")


class CollectiveError(RuntimeError):
    """A peer sent something the schedule did not expect (wrong size, dtype or kind)."""


def check_op(op: str, dtype: torch.dtype) -> ReduceOp:
    """``op`` as a :data:`ReduceOp`; raises ``ValueError`` for unknown ops and integer ``mean``."""
    for known in REDUCE_OPS:
        if op == known:
            if known == "mean" and not (dtype.is_floating_point or dtype.is_complex):
                raise ValueError(f"op 'mean' needs a floating-point tensor, got {dtype}")
            if known != "sum" and dtype == torch.bool:
                raise ValueError(f"op {op!r} is not defined for bool tensors")
            return known
    raise ValueError(f"unknown op {op!r}; expected one of {REDUCE_OPS}")


def combine(op: ReduceOp, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst <- dst (op) src`` in place (``mean`` combines like ``sum``)."""
    if op == "max":
        torch.maximum(dst, src, out=dst)
    elif op == "min":
        torch.minimum(dst, src, out=dst)
    elif dst.dtype == torch.bool:
        dst.logical_or_(src)
    else:
        dst.add_(src)


def combine_into(op: ReduceOp, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """``out <- a (op) b`` in one pass (``out`` may alias neither input)."""
    if op == "max":
        torch.maximum(a, b, out=out)
    elif op == "min":
        torch.minimum(a, b, out=out)
    elif out.dtype == torch.bool:
        torch.logical_or(a, b, out=out)
    else:
        torch.add(a, b, out=out)


def finalize(op: ReduceOp, tensor: torch.Tensor, world_size: int) -> None:
    """Turn the reduction of ``world_size`` vectors into the result of ``op`` (divides for ``mean``)."""
    if op == "mean" and world_size != 1:
        tensor.div_(world_size)


def flat_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous 1-d copy of ``tensor``'s values (detached, on the CPU)."""
    if tensor.device.type != "cpu":
        raise ValueError(f"collectives run on CPU tensors, got device {tensor.device}")
    return tensor.detach().reshape(-1).clone(memory_format=torch.contiguous_format)


def checked_piece(message: Message, *, numel: int, dtype: torch.dtype, sender: int) -> torch.Tensor:
    """The 1-d tensor ``message`` carries, after checking it is what the schedule expects."""
    piece = message.tensor
    if piece is None:
        raise CollectiveError(f"rank {sender} sent a {message.kind.name} message where a tensor was expected")
    if piece.dtype != dtype or piece.numel() != numel:
        raise CollectiveError(
            f"rank {sender} sent {piece.numel()} x {piece.dtype}, expected {numel} x {dtype}: "
            "do all ranks pass tensors of the same size and dtype, and the same chunk_bytes?"
        )
    return piece.reshape(-1)
