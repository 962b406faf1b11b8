"""Compressors: one interface for what a compressed vector is and how ranks combine it, shared by every protocol.

* :mod:`~squall.training.compress.base`: :class:`Compression` (what an all-reduce takes: how
  compressed vectors combine, its :class:`Guarantees`), :class:`Compressor` (a compression with a
  payload on the wire: encode, decode with an optional reference, exact wire bytes, error bound)
  and :class:`SharedSupport` (a compression whose ranks keep the same coordinates);
* :mod:`~squall.training.compress.dense`: :class:`DenseFloat32` and :class:`DenseFloat16`, the casts;
* :mod:`~squall.training.compress.lattice`: the reference-point lattice quantizer of SwarmSGD;
* :mod:`~squall.training.compress.topk`: :class:`TopK`, values and indices;
* :mod:`~squall.training.compress.randk`: :class:`RandK`, shared-seed coordinates, unbiased;
* :mod:`~squall.training.compress.quant`: :class:`GroupQuant`, group-wise asymmetric INT8/INT4;
* :mod:`~squall.training.compress.fp4`: :class:`Fp4E3M0`, 4-bit floats (Streaming DiLoCo's outer gradients);
* :mod:`~squall.training.compress.arc`: :class:`ArcTopK`, ARC-Top-K's shared sketch and row
  selection (a shared-support compression without a payload: its all-reduces carry plain float32);
* :mod:`~squall.training.compress.feedback`: error feedback (none, EF14, EF21, EF21M) and
  :class:`CompressedSGD` over one (optionally compressed) all-reduce.

How each combines, which is what :func:`squall.collectives.allreduce` chooses its schedule by:

=================  ========  =========  =========================================================
compression        summable  indices    all-reduce
=================  ========  =========  =========================================================
``DenseFloat32``   yes       none       ring (or butterfly) of the vector cast to float32
``DenseFloat16``   yes       none       the same in float16, half the bytes
``RandK``          yes       shared     ring of the ``k`` values at the round's shared coordinates
``ArcTopK``        yes       shared     ring of the sketch, then ring of the selected rows
``TopK``           no        own        all-gather of the payloads (values and indices)
``GroupQuant``     no        none       two-step (all-to-all, all-gather), or ring requantizing per hop
``Fp4E3M0``        no        none       the same as ``GroupQuant``
``Lattice...``     no        none       none: it decodes against the receiver's own reference
=================  ========  =========  =========================================================

:data:`COMPRESSORS` lists every compressor with a payload, :data:`SCHEMAS` the schema the wire
validates each one's payloads against (:func:`squall.wire.unpack_compressed`). Pure numpy; nothing
here knows about transports.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from squall.training.compress.arc import ArcTopK
from squall.training.compress.base import Compression, Compressor, Decoded, Guarantees, SharedSupport, Support
from squall.training.compress.dense import DenseCompressor, DenseFloat16, DenseFloat32
from squall.training.compress.feedback import EF_VARIANTS, CompressedSGD, ErrorFeedback, FeedbackConfig
from squall.training.compress.fp4 import Fp4E3M0
from squall.training.compress.lattice import LatticeCompressor
from squall.training.compress.quant import GroupQuant
from squall.training.compress.randk import RandK
from squall.training.compress.topk import TopK
from squall.wire import PayloadSchema

#: Every compressor with a payload, by its id on the wire.
COMPRESSORS: Final[MappingProxyType[str, type[Compressor]]] = MappingProxyType(
    {cls.name: cls for cls in (DenseFloat32, DenseFloat16, LatticeCompressor, TopK, RandK, GroupQuant, Fp4E3M0)}
)
#: The schema of every compressor's payloads, by id: what a receiver accepts.
SCHEMAS: Final[MappingProxyType[str, PayloadSchema]] = MappingProxyType(
    {name: cls.schema for name, cls in COMPRESSORS.items()}
)

__all__ = [
    "COMPRESSORS",
    "EF_VARIANTS",
    "SCHEMAS",
    "ArcTopK",
    "CompressedSGD",
    "Compression",
    "Compressor",
    "Decoded",
    "DenseCompressor",
    "DenseFloat16",
    "DenseFloat32",
    "ErrorFeedback",
    "FeedbackConfig",
    "Fp4E3M0",
    "GroupQuant",
    "Guarantees",
    "LatticeCompressor",
    "RandK",
    "SharedSupport",
    "Support",
    "TopK",
]
