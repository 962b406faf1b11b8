"""Framing: how messages ride on a byte stream (TCP) and in datagrams (UDP).

Streams. The 48-byte header is the length prefix: a stream is ``header, payload, header,
payload, ...`` with no other bytes. :class:`FrameDecoder` is a sans-I/O state machine that
turns received bytes into :class:`Frame` objects. It validates each header against
:class:`WireLimits` *before* allocating the payload buffer, so the maximum frame size is
``HEADER_SIZE + limits.max_message_bytes`` and a claimed 2**40-byte payload raises
:class:`WireError` having allocated nothing. Each payload gets its own freshly allocated,
exactly sized, writable buffer, so the decoded tensor can alias it (zero-copy) and outlive the
decoder. Two ways to feed it:

* ``feed(data)`` copies from any bytes-like object (simple; used by tests and small reads);
* ``get_buffer()`` / ``buffer_updated(n)`` let the caller ``recv_into`` directly: while a large
  payload is outstanding the buffer returned *is* the payload buffer, so the kernel writes the
  tensor bytes straight into their final place; otherwise it is a small staging buffer from
  which headers are parsed (small payloads are copied out of it, at most one staging buffer's
  worth per read).

Datagrams. One datagram holds exactly one frame (:func:`encode_datagram`,
:func:`decode_datagram`); :func:`chunk_messages` splits a tensor into ``CHUNK`` messages that
each fit one datagram of a given size.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final

import numpy as np
import torch

from squall.wire.codec import check_payload, encode_message
from squall.wire.dtypes import itemsize
from squall.wire.errors import WireError
from squall.wire.header import HEADER_SIZE, Header, unpack_header
from squall.wire.kinds import MsgType
from squall.wire.limits import DEFAULT_LIMITS, WireLimits
from squall.wire.message import Message
from squall.wire.tensor import descriptor_size

#: Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP); bigger datagrams cannot be sent.
MAX_UDP_DATAGRAM: Final = 65507
#: UDP payload that fits a 1500-byte Ethernet MTU without IP fragmentation.
MTU_DATAGRAM: Final = 1472


@dataclass(frozen=True, slots=True)
class Frame:
    """A validated header and its complete payload (a writable buffer of its own)."""

    header: Header
    payload: memoryview


class FrameDecoder:
    """Split a byte stream into validated frames (see the module docstring).

    :param first_kind: if set, the first frame must be of this type (e.g. ``HELLO``), checked
        from its header; an unauthenticated connection then cannot make the receiver
        allocate more than a control payload.

    After a :class:`WireError` the decoder is poisoned: the stream has lost its framing, and
    every later call raises the same error (once the frames completed before it were taken).
    """

    def __init__(
        self,
        limits: WireLimits = DEFAULT_LIMITS,
        *,
        staging_bytes: int = 1 << 16,
        direct_threshold: int = 1 << 16,
        first_kind: MsgType | None = None,
    ) -> None:
        if staging_bytes < HEADER_SIZE:
            raise ValueError(f"staging_bytes must be at least {HEADER_SIZE}")
        self._limits = limits
        self._first_kind = first_kind
        self._direct_threshold = direct_threshold
        self._head = bytearray(HEADER_SIZE)
        self._head_fill = 0
        self._header: Header | None = None
        self._payload = memoryview(bytearray())
        self._payload_fill = 0
        self._staging = memoryview(bytearray(staging_bytes))
        self._direct = False
        self._ready: deque[Frame] = deque()
        self._error: WireError | None = None

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame has been received (EOF now would truncate it)."""
        return self._head_fill > 0 or self._header is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Consume ``data`` (copied); completed frames queue up for :meth:`next_frame`."""
        self._raise_if_poisoned()
        self._guard(memoryview(data).cast("B"))

    def get_buffer(self) -> memoryview:
        """A writable buffer for the next ``recv_into``; then report the count to :meth:`buffer_updated`."""
        self._raise_if_poisoned()
        remaining = len(self._payload) - self._payload_fill
        self._direct = self._header is not None and remaining >= self._direct_threshold
        return self._payload[self._payload_fill :] if self._direct else self._staging

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the buffer :meth:`get_buffer` returned."""
        self._raise_if_poisoned()
        if self._direct:
            self._direct = False
            self._payload_fill += nbytes
            self._maybe_finish_payload()
        else:
            self._guard(self._staging[:nbytes])

    def next_frame(self) -> Frame | None:
        """The oldest completed frame, or ``None``.

        Frames completed before a :class:`WireError` are still returned; the error is raised
        here once they have all been taken (and by every other method straight away).
        """
        if self._ready:
            return self._ready.popleft()
        self._raise_if_poisoned()
        return None

    def _raise_if_poisoned(self) -> None:
        if self._error is not None:
            raise self._error

    def _guard(self, view: memoryview) -> None:
        try:
            self._consume(view)
        except WireError as exc:
            self._error = exc
            if not self._ready:
                raise

    def _consume(self, view: memoryview) -> None:
        pos = 0
        while pos < len(view):
            if self._header is None:
                take = min(HEADER_SIZE - self._head_fill, len(view) - pos)
                self._head[self._head_fill : self._head_fill + take] = view[pos : pos + take]
                self._head_fill += take
                pos += take
                if self._head_fill == HEADER_SIZE:
                    self._start_payload()
            else:
                take = min(len(self._payload) - self._payload_fill, len(view) - pos)
                self._payload[self._payload_fill : self._payload_fill + take] = view[pos : pos + take]
                self._payload_fill += take
                pos += take
                self._maybe_finish_payload()

    def _start_payload(self) -> None:
        header = unpack_header(self._head, self._limits)
        if self._first_kind is not None and header.kind is not self._first_kind:
            raise WireError(f"expected {self._first_kind.name} first, got {header.kind.name}")
        self._first_kind = None
        self._head_fill = 0
        self._header = header
        self._payload = allocate(header.payload_len)
        self._payload_fill = 0
        self._maybe_finish_payload()

    def _maybe_finish_payload(self) -> None:
        if self._header is None or self._payload_fill < len(self._payload):
            return
        self._ready.append(Frame(self._header, self._payload))
        self._header = None
        self._payload = memoryview(bytearray())
        self._payload_fill = 0


def allocate(nbytes: int) -> memoryview:
    """A fresh writable, uninitialised buffer of ``nbytes`` (call only after validating the size)."""
    try:
        return np.empty(nbytes, dtype=np.uint8).data
    except MemoryError:
        raise WireError(f"cannot allocate a {nbytes}-byte payload buffer") from None


def encode_datagram(
    message: Message,
    *,
    sender: int,
    max_bytes: int = MAX_UDP_DATAGRAM,
    limits: WireLimits = DEFAULT_LIMITS,
    crc: bool = True,
) -> bytes:
    """One datagram holding ``message``; raises :class:`WireError` if it exceeds ``max_bytes``."""
    frame = encode_message(message, sender=sender, limits=limits, crc=crc)
    if frame.nbytes > max_bytes:
        raise WireError(f"{message.kind.name} message of {frame.nbytes} bytes exceeds the {max_bytes}-byte datagram")
    return frame.tobytes()


def decode_datagram(
    data: bytes | bytearray | memoryview, *, limits: WireLimits = DEFAULT_LIMITS
) -> tuple[Header, memoryview]:
    """Validate a datagram's header, length and CRC; return the header and a view of its payload."""
    view = memoryview(data).cast("B")
    header = unpack_header(view, limits)
    payload = view[HEADER_SIZE:]
    check_payload(header, payload)
    return header, payload


def chunk_capacity(max_frame_bytes: int, dtype: torch.dtype, ndim: int) -> int:
    """Elements of ``dtype`` that fit in one ``CHUNK`` frame of at most ``max_frame_bytes``."""
    room = max_frame_bytes - HEADER_SIZE - descriptor_size(ndim, chunk=True)
    per_chunk = room // itemsize(dtype)
    if per_chunk < 1:
        raise WireError(f"a {max_frame_bytes}-byte frame has no room for a {ndim}-d {dtype} chunk")
    return per_chunk


def chunk_messages(
    tensor: torch.Tensor,
    *,
    max_frame_bytes: int,
    round: int = 0,
    tag: int = 0,
    limits: WireLimits = DEFAULT_LIMITS,
) -> list[Message]:
    """Split ``tensor`` into ``CHUNK`` messages that each encode to at most ``max_frame_bytes``.

    Chunks are views of one contiguous copy of the tensor (no copy if it is already a
    contiguous CPU tensor); an empty tensor still yields one (empty) chunk, so the receiver
    learns its shape.
    """
    shape = tuple(int(d) for d in tensor.shape)
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    per_chunk = chunk_capacity(max_frame_bytes, tensor.dtype, len(shape))
    count = max(1, math.ceil(flat.numel() / per_chunk))
    if count > limits.max_chunk_count:
        raise WireError(f"{count} chunks exceed the limit of {limits.max_chunk_count}")
    return [
        Message.of_chunk(
            flat[k * per_chunk : (k + 1) * per_chunk],
            full_shape=shape,
            offset=min(k * per_chunk, flat.numel()),
            chunk_id=k,
            chunk_count=count,
            round=round,
            tag=tag,
        )
        for k in range(count)
    ]
