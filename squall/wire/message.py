"""The decoded form of one message, as protocols build it and transports deliver it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from squall.wire.control import JsonValue
from squall.wire.kinds import CONTROL_TYPES, EMPTY_TYPES, MsgType


@dataclass(frozen=True, slots=True, eq=False)
class Message:
    """One message: a header's worth of addressing plus a tensor, a control object or nothing.

    Build it with :meth:`of_tensor`, :meth:`of_chunk`, :meth:`of_control` or :meth:`empty`.
    ``sender`` is ignored when encoding (the transport stamps its own rank into the header)
    and filled in from the header when decoding.
    """

    kind: MsgType  # what this message is; decides which payload field is set
    round: int = 0  # training round / step the message belongs to
    tag: int = 0  # application channel; Transport.recv can wait for one tag
    tensor: torch.Tensor | None = None  # TENSOR: the tensor; CHUNK: this chunk's elements (1-d)
    control: Mapping[str, JsonValue] | None = None  # HELLO, CONTROL, ABORT: the object
    chunk_id: int = 0  # CHUNK: index of this chunk
    chunk_count: int = 1  # CHUNK: number of chunks the whole tensor was split into
    full_shape: tuple[int, ...] | None = None  # CHUNK: shape of the whole tensor
    offset: int = 0  # CHUNK: flattened index of this chunk's first element in the whole tensor
    sender: int | None = None  # rank of the sender, set on receipt

    def __post_init__(self) -> None:
        wants_tensor = self.kind in (MsgType.TENSOR, MsgType.CHUNK)
        if wants_tensor != (self.tensor is not None):
            raise ValueError(f"{self.kind.name} message {'needs' if wants_tensor else 'cannot carry'} a tensor")
        if (self.kind in CONTROL_TYPES) != (self.control is not None):
            raise ValueError(
                f"{self.kind.name} message {'needs' if self.kind in CONTROL_TYPES else 'cannot carry'} a control object"
            )
        if (self.kind is MsgType.CHUNK) != (self.full_shape is not None):
            raise ValueError("full_shape is required for CHUNK messages and only for them")

    @classmethod
    def of_tensor(cls, tensor: torch.Tensor, *, round: int = 0, tag: int = 0) -> Message:
        """A ``TENSOR`` message carrying all of ``tensor``."""
        return cls(MsgType.TENSOR, round=round, tag=tag, tensor=tensor)

    @classmethod
    def of_chunk(
        cls,
        piece: torch.Tensor,
        *,
        full_shape: tuple[int, ...],
        offset: int,
        chunk_id: int,
        chunk_count: int,
        round: int = 0,
        tag: int = 0,
    ) -> Message:
        """A ``CHUNK``: ``piece`` holds consecutive elements of a flattened tensor of ``full_shape``."""
        return cls(
            MsgType.CHUNK,
            round=round,
            tag=tag,
            tensor=piece,
            chunk_id=chunk_id,
            chunk_count=chunk_count,
            full_shape=tuple(int(d) for d in full_shape),
            offset=offset,
        )

    @classmethod
    def of_control(
        cls, obj: Mapping[str, JsonValue], *, kind: MsgType = MsgType.CONTROL, round: int = 0, tag: int = 0
    ) -> Message:
        """A control message (``CONTROL`` unless ``kind`` says ``HELLO`` or ``ABORT``)."""
        return cls(kind, round=round, tag=tag, control=obj)

    @classmethod
    def empty(cls, kind: MsgType, *, round: int = 0, tag: int = 0) -> Message:
        """A payload-less ``HEARTBEAT`` or ``BYE``."""
        if kind not in EMPTY_TYPES:
            raise ValueError(f"{kind.name} messages carry a payload")
        return cls(kind, round=round, tag=tag)
