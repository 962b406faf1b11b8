"""The one interface every compressor implements, and what it promises.

A compressor is handed to a protocol (SwarmSGD's exchanges today; all-reduce and gossip next),
the way hivemind hands a compression to its averager. It does three things:

* :meth:`Compressor.encode` a vector into a :class:`~squall.wire.CompressedPayload`: scalar
  parameters plus 1-d typed arrays, which the wire lays out and validates
  (:mod:`squall.wire.compressed`) against the compressor's :attr:`Compressor.schema`;
* :meth:`Compressor.decode` a payload back into a vector, given the receiver's ``reference``
  where the scheme needs one (the lattice decodes relative to the receiver's model);
* say exactly how many bytes a payload of ``numel`` elements costs on the wire
  (:meth:`Compressor.wire_bytes`), so cost models and byte counters agree with the wire.

Its :class:`Guarantees` say what a protocol may rely on: unbiasedness (for plain SGD-style
averaging), contraction (for error feedback), and the error bound of one encode/decode.

Future compressors (Top-K, Rand-K, INT8/INT4 group quantization, error feedback) fit the same
shape: Top-K is ``values`` (float32) and ``indices`` (int32, bound ``numel``) arrays; group
quantization is ``codes`` and per-group ``scales``; error feedback wraps a compressor and keeps
the residual on the sender.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from squall.wire import CompressedPayload, PayloadSchema

Vector = npt.NDArray[np.floating[Any]]


@dataclass(frozen=True, slots=True)
class Guarantees:
    """What one ``decode(encode(x))`` promises, for a protocol to rely on."""

    unbiased: bool  # E[decode(encode(x))] = x (deterministic schemes: only when exact)
    contractive: bool  # ||decode(encode(x)) - x||^2 <= (1 - delta) ||x||^2 for every x
    delta: float | None  # the contraction factor in (0, 1] when contractive, else None
    error_bound: str  # what bounds |decode(encode(x)) - x|, in words (Compressor.error_bound gives the number)
    needs_reference: bool = False  # decode needs the receiver's reference vector

    def __post_init__(self) -> None:
        if self.contractive != (self.delta is not None):
            raise ValueError("delta is given exactly when the compressor is contractive")
        if self.delta is not None and not 0 < self.delta <= 1:
            raise ValueError(f"delta must be in (0, 1], got {self.delta}")


@dataclass(frozen=True, slots=True)
class Decoded:
    """A receiver's reconstruction, and whether it is the vector the sender meant."""

    values: Vector  # the reconstruction (float64 or float32)
    ok: bool  # False: decoding detectably failed (e.g. the reference was too far); values are then wrong


class Compressor(ABC):
    """Encode vectors to wire payloads and back (see the module docstring).

    Subclasses set :attr:`name` (the id on the wire) and :attr:`schema` (what the wire checks).
    An instance carries its settings (bits, spacing, k); a receiver builds one from a payload's
    parameters where they travel with it (:meth:`decode` never needs the sender's instance).
    """

    name: ClassVar[str]  # compressor id on the wire
    schema: ClassVar[PayloadSchema]  # what a valid payload looks like

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> Compressor:
        """The instance a receiver decodes ``payload`` with: its settings are the payload's own parameters.

        Compressors whose constructor takes settings override this; the payload is already validated
        against :attr:`schema`, so its parameters are in range.
        """
        return cls()

    @property
    @abstractmethod
    def guarantees(self) -> Guarantees:
        """What :meth:`decode` of :meth:`encode` promises."""

    @abstractmethod
    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """The payload for the 1-d vector ``x``.

        :raises ValueError: ``x`` cannot be encoded (not finite, out of range).
        """

    @abstractmethod
    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """The vector ``payload`` stands for.

        :param reference: the receiver's vector near the sender's (only where
            :attr:`Guarantees.needs_reference`).
        :raises ValueError: the payload is not this compressor's, or a needed reference is missing.
        """

    @abstractmethod
    def wire_bytes(self, numel: int) -> int:
        """Exact bytes of the packed payload of a vector of ``numel`` elements."""

    @abstractmethod
    def error_bound(self, payload: CompressedPayload) -> float:
        """Sup-norm bound on ``|x - decode(payload)|`` for the ``x`` it encodes (when decoding is ok)."""

    def _own(self, payload: CompressedPayload) -> None:
        if payload.compressor != self.name:
            raise ValueError(f"a {payload.compressor!r} payload cannot be decoded by {self.name!r}")
