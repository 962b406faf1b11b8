"""Compressors: one interface for encoding vectors to wire payloads, shared by every protocol.

* :mod:`~squall.training.compress.base`: :class:`Compressor` (encode, decode with an optional
  reference, exact wire bytes, error bound) and its :class:`Guarantees`;
* :mod:`~squall.training.compress.dense`: :class:`DenseFloat32`, the trivial one;
* :mod:`~squall.training.compress.lattice`: the reference-point lattice quantizer of SwarmSGD;
* :mod:`~squall.training.compress.topk`: :class:`TopK`, values and indices;
* :mod:`~squall.training.compress.randk`: :class:`RandK`, shared-seed coordinates, unbiased;
* :mod:`~squall.training.compress.quant`: :class:`GroupQuant`, group-wise asymmetric INT8/INT4;
* :mod:`~squall.training.compress.arc`: ARC-Top-K's sketch, row selection and packing (a
  collective scheme, not a payload: its all-reduces carry plain float32);
* :mod:`~squall.training.compress.feedback`: error feedback (none, EF14, EF21, EF21M) and
  :class:`CompressedSGD`.

:data:`SCHEMAS` maps every compressor id to the schema the wire validates its payloads against
(:func:`squall.wire.unpack_compressed`). Pure numpy; nothing here knows about transports.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from squall.training.compress.base import Compressor, Decoded, Guarantees
from squall.training.compress.dense import DenseFloat32
from squall.training.compress.feedback import EF_VARIANTS, CompressedSGD, ErrorFeedback, FeedbackConfig
from squall.training.compress.lattice import LatticeCompressor
from squall.training.compress.quant import GroupQuant
from squall.training.compress.randk import RandK
from squall.training.compress.topk import TopK
from squall.wire import PayloadSchema

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
