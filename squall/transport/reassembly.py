"""Reassembly of chunked tensors from datagrams that may be lost, duplicated or reordered.

Each ``CHUNK`` describes the whole tensor (dtype, shape, chunk count) and carries an element
offset, so the first chunk to arrive opens a zero-filled buffer of the whole tensor plus a
boolean mask, and every later chunk is copied to its place. Duplicates are ignored, and so
are chunks whose description disagrees with the first one. A tensor is identified by
``(sender, tag, round)``; once it has been taken, later chunks for it are counted as late and
dropped, so a slow straggler cannot re-open it.

Memory is bounded twice: at most ``max_open`` tensors are being assembled at once, holding at
most ``max_bytes`` in total; when a new tensor would exceed either bound the least recently
opened tensor nobody is waiting for is evicted, and if that is not enough the chunk is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from squall.wire import DEFAULT_LIMITS, Header, MsgType, TensorPayload, WireLimits, unpack_tensor_payload
from squall.wire.dtypes import itemsize

logger = logging.getLogger(__name__)

Key = tuple[int, int, int]  # (sender, tag, round)


@dataclass(frozen=True, slots=True)
class PartialTensor:
    """What arrived of one chunked tensor."""

    tensor: torch.Tensor  # the whole tensor; elements that did not arrive are zero
    mask: torch.Tensor  # bool, same shape: True where the element arrived
    chunks: torch.Tensor  # bool, one per chunk: True where the chunk arrived

    @property
    def chunk_count(self) -> int:
        """Number of chunks the tensor was sent in."""
        return int(self.chunks.numel())

    @property
    def chunks_received(self) -> int:
        """Number of distinct chunks that arrived."""
        return int(self.chunks.sum())

    @property
    def complete(self) -> bool:
        """True if every chunk arrived."""
        return bool(self.chunks.all())

    @property
    def missing_chunks(self) -> list[int]:
        """Ids of the chunks that did not arrive."""
        return [int(i) for i in torch.nonzero(~self.chunks).flatten()]

    @classmethod
    def nothing(cls, shape: tuple[int, ...], dtype: torch.dtype) -> PartialTensor:
        """A tensor of which no chunk arrived (zero chunks known)."""
        return cls(
            torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)
        )


class _Assembly:
    """One tensor being put together."""

    def __init__(self, payload: TensorPayload, chunk_count: int) -> None:
        self.dtype = payload.dtype
        self.shape = payload.shape
        numel = math.prod(self.shape)
        self._flat = torch.zeros(numel, dtype=self.dtype)
        self._bytes = self._flat.view(torch.uint8).numpy() if numel else np.empty(0, dtype=np.uint8)
        self._mask = torch.zeros(numel, dtype=torch.bool)
        self._mask_np = self._mask.numpy()  # numpy slicing is several times cheaper per chunk
        self._chunks = torch.zeros(chunk_count, dtype=torch.bool)
        self._chunks_np = self._chunks.numpy()
        self.received = 0
        self.nbytes = numel * (itemsize(self.dtype) + 1) + chunk_count

    @property
    def chunk_count(self) -> int:
        return int(self._chunks.numel())

    @property
    def complete(self) -> bool:
        return self.received == self.chunk_count

    def matches(self, payload: TensorPayload, chunk_count: int) -> bool:
        return (payload.dtype, payload.shape, chunk_count) == (self.dtype, self.shape, self.chunk_count)

    def add(self, chunk_id: int, payload: TensorPayload) -> bool:
        """Copy one chunk in; False if it had already arrived."""
        if self._chunks_np[chunk_id]:
            return False
        assert payload.offset is not None
        start = payload.offset * itemsize(self.dtype)
        self._bytes[start : start + len(payload.data)] = np.frombuffer(payload.data, dtype=np.uint8)
        self._mask_np[payload.offset : payload.offset + payload.count] = True
        self._chunks_np[chunk_id] = True
        self.received += 1
        return True

    def result(self) -> PartialTensor:
        return PartialTensor(self._flat.reshape(self.shape), self._mask.reshape(self.shape), self._chunks)


class Reassembler:
    """Chunks in, :class:`PartialTensor` out (see the module docstring)."""

    def __init__(
        self,
        *,
        limits: WireLimits = DEFAULT_LIMITS,
        max_open: int = 256,
        max_bytes: int = 2 << 30,
        remember_taken: int = 4096,
    ) -> None:
        self._limits = limits
        self._max_open = max_open
        self._max_bytes = max_bytes
        self._remember = remember_taken
        self._open: OrderedDict[Key, _Assembly] = OrderedDict()
        self._taken: OrderedDict[Key, None] = OrderedDict()
        self._waiters: dict[Key, asyncio.Future[None]] = {}
        self._open_bytes = 0
        self.late_chunks = 0  # chunks for tensors already taken
        self.duplicate_chunks = 0  # chunks that had already arrived
        self.dropped_chunks = 0  # chunks refused for lack of memory or for disagreeing metadata

    def add(self, sender: int, header: Header, payload: memoryview) -> None:
        """Take in one ``CHUNK``; raises :class:`WireError` if its payload is invalid."""
        parsed = unpack_tensor_payload(MsgType.CHUNK, payload, self._limits)
        key = (sender, header.tag, header.round)
        if key in self._taken:
            self.late_chunks += 1
            return
        assembly = self._open.get(key) or self._open_new(key, parsed, header.chunk_count)
        if assembly is None:
            self.dropped_chunks += 1
            return
        if not assembly.matches(parsed, header.chunk_count):
            logger.debug("chunk %d of %s disagrees with the first chunk; dropped", header.chunk_id, key)
            self.dropped_chunks += 1
            return
        if not assembly.add(header.chunk_id, parsed):
            self.duplicate_chunks += 1
        elif assembly.complete:
            self._wake(key)

    async def wait(self, key: Key, timeout: float | None) -> None:
        """Return when the tensor ``key`` is complete, its sender failed, or ``timeout`` passed."""
        assembly = self._open.get(key)
        if assembly is not None and assembly.complete:
            return
        if key in self._waiters:
            raise RuntimeError(f"someone is already waiting for tensor {key}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            pass
        finally:
            self._waiters.pop(key, None)

    def take(self, key: Key) -> PartialTensor | None:
        """Hand over what arrived of ``key`` (``None`` if nothing) and ignore its later chunks."""
        self._taken[key] = None
        while len(self._taken) > self._remember:
            self._taken.popitem(last=False)
        assembly = self._open.pop(key, None)
        if assembly is None:
            return None
        self._open_bytes -= assembly.nbytes
        return assembly.result()

    def wake_sender(self, sender: int) -> None:
        """``sender`` failed: wake everyone waiting for its tensors."""
        for key in [k for k in self._waiters if k[0] == sender]:
            self._wake(key)

    def close(self) -> None:
        """Wake every waiter and drop every open tensor."""
        for key in list(self._waiters):
            self._wake(key)
        self._open.clear()
        self._open_bytes = 0

    def _wake(self, key: Key) -> None:
        future = self._waiters.get(key)
        if future is not None and not future.done():
            future.set_result(None)

    def _open_new(self, key: Key, payload: TensorPayload, chunk_count: int) -> _Assembly | None:
        need = math.prod(payload.shape) * (itemsize(payload.dtype) + 1) + chunk_count
        for old in [k for k in self._open if k not in self._waiters]:
            if len(self._open) < self._max_open and self._open_bytes + need <= self._max_bytes:
                break
            logger.debug("evicting unfinished tensor %s to make room", old)
            self._open_bytes -= self._open.pop(old).nbytes
        if len(self._open) >= self._max_open or self._open_bytes + need > self._max_bytes:
            logger.warning("no room to reassemble tensor %s (%d bytes); chunk dropped", key, need)
            return None
        assembly = self._open[key] = _Assembly(payload, chunk_count)
        self._open_bytes += assembly.nbytes
        return assembly
