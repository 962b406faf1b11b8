"""Reduction operators of the collectives, and the checks every received piece goes through.

``sum``, ``max`` and ``min`` are combined elementwise as pieces arrive; ``mean`` is a ``sum``
followed by one division by ``n``. Every combination used here is commutative elementwise in
IEEE arithmetic (``a + b`` and ``b + a`` round to the same value), which is why ranks that
combine the same two operands in opposite roles still hold identical bits.

Threads. Elementwise work here runs on the calling thread, through numpy views of the tensors,
for every dtype numpy shares with torch (:data:`NUMPY_DTYPES`); other dtypes (``float16``,
``bfloat16``) go through torch. Torch would split a large ``add_`` or ``copy_`` across its
intra-op thread pool, and where ranks share cores (several workers per host, containers with a
CPU quota below the cores they see) those threads spin against each other and against the
network stack, turning a sub-millisecond add into tens of milliseconds (benchmarks/README.md,
"What made the ring fast"). The results are the same bits either way: elementwise IEEE operations do not
depend on how the range is split.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from squall.wire import Message

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


#: dtypes whose elementwise work runs through numpy (same IEEE results, one thread).
NUMPY_DTYPES = frozenset({
    torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
})

_NUMPY_DTYPE: dict[torch.dtype, Any] = {
    torch.float32: np.float32, torch.float64: np.float64, torch.complex64: np.complex64,
    torch.complex128: np.complex128, torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8,
    torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
}

_NUMPY_OPS: dict[ReduceOp, Any] = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


def as_numpy(tensor: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """A numpy view of ``tensor`` (no copy), or None where numpy lacks its dtype or cannot view it."""
    if tensor.dtype not in NUMPY_DTYPES:
        return None
    try:
        return tensor.numpy()  # refuses tensors that require grad or carry a conj/neg bit
    except RuntimeError:
        return None


def _numpy(*tensors: torch.Tensor) -> list[np.ndarray[Any, Any]] | None:
    """numpy views of all ``tensors``, or None if any has none."""
    arrays = []
    for tensor in tensors:
        array = as_numpy(tensor)
        if array is None:
            return None
        arrays.append(array)
    return arrays


def numpy_ufunc(op: ReduceOp, dtype: torch.dtype) -> Any:
    """The numpy ufunc that combines two arrays of ``dtype`` under ``op`` (``out=`` allowed)."""
    return np.logical_or if dtype == torch.bool and op in ("sum", "mean") else _NUMPY_OPS[op]


def combine(op: ReduceOp, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst <- dst (op) src`` in place (``mean`` combines like ``sum``)."""
    arrays = _numpy(dst, src) if dst.dtype == src.dtype else None
    if arrays is not None:
        numpy_ufunc(op, dst.dtype)(arrays[0], arrays[1], out=arrays[0])
        return
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
    arrays = _numpy(a, b, out) if a.dtype == b.dtype == out.dtype else None
    if arrays is not None:
        numpy_ufunc(op, out.dtype)(arrays[0], arrays[1], out=arrays[2])
        return
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
        arrays = _numpy(tensor) if tensor.dtype in (torch.float32, torch.float64) else None
        if arrays is not None:
            np.true_divide(arrays[0], arrays[0].dtype.type(world_size), out=arrays[0])
        else:
            tensor.div_(world_size)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst <- src`` elementwise (same shape and dtype), on the calling thread where numpy can."""
    arrays = _numpy(dst, src) if dst.dtype == src.dtype else None
    if arrays is not None:
        np.copyto(arrays[0], arrays[1], casting="no")
    else:
        dst.copy_(src)


def flat_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous 1-d copy of ``tensor``'s values (detached, on the CPU)."""
    source = flat_view(tensor)
    out = empty_like_flat(source)
    copy_into(out, source)
    return out


def flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values as a contiguous 1-d CPU tensor, detached: a view when it is contiguous."""
    if tensor.device.type != "cpu":
        raise ValueError(f"collectives run on CPU tensors, got device {tensor.device}")
    return tensor.detach().reshape(-1)


def empty_like_flat(tensor: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous 1-d CPU tensor with ``tensor``'s element count and dtype.

    Where numpy has the dtype the memory comes from numpy, whose allocator keeps large blocks
    for reuse and asks for transparent huge pages: a fresh 16 MiB output then costs a handful of
    page faults instead of 4096 (each zeroing a page), which took as long as the copy itself.
    """
    if tensor.dtype in NUMPY_DTYPES:
        return torch.from_numpy(np.empty(tensor.numel(), dtype=_NUMPY_DTYPE[tensor.dtype]))
    return torch.empty(tensor.numel(), dtype=tensor.dtype)


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
    return piece if piece.dim() == 1 else piece.reshape(-1)
