"""The interfaces every compressor implements, and what it promises.

A compressor is handed to a protocol the way hivemind hands a compression to its averager: to
SwarmSGD's exchanges, and to the one all-reduce of :mod:`squall.collectives`
(``allreduce(..., compression=...)``), which reads the compressor's declared properties to choose
how the ranks' vectors travel. Three interfaces:

* :class:`Compression`: what an all-reduce takes. It declares how the compressed vectors of
  several ranks combine: :attr:`Compression.summable` (two ranks' compressed vectors add
  coordinate by coordinate without being decoded) and :attr:`Compression.indices` (``"none"``:
  every coordinate travels; ``"shared"``: every rank keeps the same coordinates, agreed without
  sending them; ``"own"``: each rank keeps its own and sends their indices beside the values);
  and its :class:`Guarantees`.
* :class:`Compressor`: a compression with a payload of its own on the wire. It encodes a vector
  into a :class:`~squall.wire.CompressedPayload` (scalar parameters plus 1-d typed arrays, which
  the wire lays out and validates, :mod:`squall.wire.compressed`, against its
  :attr:`Compressor.schema`), decodes a payload back (given the receiver's ``reference`` where the
  scheme needs one: the lattice decodes relative to the receiver's model), and says exactly how
  many bytes a payload of ``numel`` elements costs (:meth:`Compressor.wire_bytes`), so cost models
  and byte counters agree with the wire.
* :class:`SharedSupport`: a compression whose ranks keep the same coordinates (Rand-K from a shared
  seed, ARC-Top-K from a shared sketch): the hooks that agree on them (:meth:`SharedSupport.sketch`,
  :meth:`SharedSupport.support`) and a :class:`Support` that packs and unpacks their values.

The :class:`Guarantees` say what a protocol may rely on: unbiasedness (for plain SGD-style
averaging), contraction (for error feedback), and the error bound of one encode/decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from squall.wire import CompressedPayload, PayloadSchema

Vector = npt.NDArray[np.floating[Any]]
Floats = npt.NDArray[np.float32]
#: Which coordinates of a compressed vector travel: all, the same ones on every rank, or each rank's own.
Indices = Literal["none", "shared", "own"]


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


class Compression(ABC):
    """Anything :func:`squall.collectives.allreduce` takes as ``compression=`` (see the module docstring).

    Subclasses set :attr:`name`, :attr:`summable` and :attr:`indices`; the all-reduce chooses its
    schedule from the last two.
    """

    name: ClassVar[str]  # the compression's id (on the wire, for a Compressor)
    summable: ClassVar[bool]  # two ranks' compressed vectors add coordinate by coordinate without decoding
    indices: ClassVar[Indices]  # which coordinates travel (module docstring)

    @property
    @abstractmethod
    def guarantees(self) -> Guarantees:
        """What one compression round trip promises."""


class Compressor(Compression):
    """Encode vectors to wire payloads and back (see the module docstring).

    Subclasses set :attr:`name` (the id on the wire) and :attr:`schema` (what the wire checks).
    An instance carries its settings (bits, spacing, k); a receiver builds one from a payload's
    parameters where they travel with it (:meth:`decode` never needs the sender's instance).
    """

    schema: ClassVar[PayloadSchema]  # what a valid payload looks like

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> Compressor:
        """The instance a receiver decodes ``payload`` with: its settings are the payload's own parameters.

        Compressors whose constructor takes settings override this; the payload is already validated
        against :attr:`schema`, so its parameters are in range.
        """
        return cls()

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

    @property
    def group_size(self) -> int:
        """Consecutive elements encoded together: an all-reduce never cuts a vector inside such a group."""
        return 1

    def accumulate(self, payload: CompressedPayload, into: Floats) -> None:
        """``into += decode(payload)``: how an all-reduce adds a peer's (validated) payload to a running sum.

        Compressors whose payload covers few coordinates override this to touch only those.
        """
        into += np.asarray(self.decode(payload).values, dtype=np.float32)

    def mismatch(self, payload: CompressedPayload) -> str | None:
        """Why a peer's (validated) payload was not made with this compressor's settings, or None.

        An all-reduce refuses a peer whose settings differ from this rank's where the reduction
        would be wrong otherwise (group quantization with another group size).
        """
        return None

    def _own(self, payload: CompressedPayload) -> None:
        if payload.compressor != self.name:
            raise ValueError(f"a {payload.compressor!r} payload cannot be decoded by {self.name!r}")


class Support(ABC):
    """The coordinates every rank keeps in one all-reduce of a :class:`SharedSupport` compression."""

    @abstractmethod
    def gather(self, x: Floats) -> Floats:
        """The kept values of the float32 vector ``x``, packed (contiguous float32)."""

    @abstractmethod
    def scatter(self, values: Floats, numel: int) -> Floats:
        """The dense float32 vector of ``numel`` elements that packed ``values`` stand for (zero elsewhere)."""


class SharedSupport(Compression):
    """A compression whose ranks all keep the same coordinates, so only values travel (see the module docstring).

    An all-reduce first averages every rank's :meth:`sketch` (when there is one), then asks
    :meth:`support` which coordinates to keep; every rank computes the same support from the same
    inputs, so the packed values of all ranks line up and add coordinate by coordinate.
    """

    summable: ClassVar[bool] = True
    indices: ClassVar[Indices] = "shared"
    sketched: ClassVar[bool] = False  # the support is chosen from the ranks' mean sketch (else from shared state)

    def sketch(self, x: Floats, round: int) -> Floats | None:
        """What the ranks average before choosing the support (None exactly when not :attr:`sketched`).

        :param round: the all-reduce's round, the same on every rank (per-round shared seeds).
        """
        return None

    def sketch_numel(self, numel: int) -> int:
        """Floats of :meth:`sketch` for a vector of ``numel`` elements (0 without a sketch)."""
        return 0

    @abstractmethod
    def support(self, numel: int, round: int, mean_sketch: Floats | None) -> Support:
        """The coordinates kept this round, the same on every rank given the same mean sketch."""

    @abstractmethod
    def support_numel(self, numel: int) -> int:
        """Values kept for a vector of ``numel`` elements."""
