"""Compressors: one interface for encoding vectors to wire payloads, shared by every protocol.

* :mod:`~protocols.common.compress.base`: :class:`Compressor` (encode, decode with an optional
  reference, exact wire bytes, error bound) and its :class:`Guarantees`;
* :mod:`~protocols.common.compress.dense`: :class:`DenseFloat32`, the trivial one;
* :mod:`~protocols.common.compress.lattice`: the reference-point lattice quantizer of SwarmSGD;
* :mod:`~protocols.common.compress.topk`: :class:`TopK`, values and indices;
* :mod:`~protocols.common.compress.randk`: :class:`RandK`, shared-seed coordinates, unbiased;
* :mod:`~protocols.common.compress.quant`: :class:`GroupQuant`, group-wise asymmetric INT8/INT4;
* :mod:`~protocols.common.compress.arc`: ARC-Top-K's sketch, row selection and packing (a
  collective scheme, not a payload: its all-reduces carry plain float32);
* :mod:`~protocols.common.compress.feedback`: error feedback (none, EF14, EF21, EF21M) and
  :class:`CompressedSGD`.

:data:`SCHEMAS` maps every compressor id to the schema the wire validates its payloads against
(:func:`protocols.wire.unpack_compressed`). Pure numpy; nothing here knows about transports.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from protocols.common.compress.base import Compressor, Decoded, Guarantees
from protocols.common.compress.dense import DenseFloat32
from protocols.common.compress.feedback import EF_VARIANTS, CompressedSGD, ErrorFeedback, FeedbackConfig
from protocols.common.compress.lattice import LatticeCompressor
from protocols.common.compress.quant import GroupQuant
from protocols.common.compress.randk import RandK
from protocols.common.compress.topk import TopK
from protocols.wire import PayloadSchema

#: Every compressor, by its id on the wire.
COMPRESSORS: Final[MappingProxyType[str, type[Compressor]]] = MappingProxyType(
    {cls.name: cls for cls in (DenseFloat32, LatticeCompressor, TopK, RandK, GroupQuant)}
)
#: The schema of every compressor's payloads, by id: what a receiver accepts.
SCHEMAS: Final[MappingProxyType[str, PayloadSchema]] = MappingProxyType(
    {name: cls.schema for name, cls in COMPRESSORS.items()}
)

__all__ = [
    "COMPRESSORS",
    "EF_VARIANTS",
    "SCHEMAS",
    "CompressedSGD",
    "Compressor",
    "Decoded",
    "DenseFloat32",
    "ErrorFeedback",
    "FeedbackConfig",
    "GroupQuant",
    "Guarantees",
    "LatticeCompressor",
    "RandK",
    "TopK",
]
