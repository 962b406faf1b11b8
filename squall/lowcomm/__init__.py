"""What the low-communication family (DiLoCo, Streaming DiLoCo, SPARTA, DeMo and their DDP baseline) shares.

* :mod:`~squall.lowcomm.average`: :class:`Averager`, the one seam through which these protocols
  average a vector over all ranks: the wire dtype and emulated payload of
  :mod:`squall.training.payload`, and an optional compressor, over :func:`squall.collectives.allreduce`;
  with its exact byte count.

The protocols themselves live in their folders (``squall/protocols/diloco``, ``streaming_diloco``,
``sparta``, ``demo``); a folder does not import another, so what two of them need is here.
"""

from __future__ import annotations

from squall.lowcomm.average import AVERAGE_TAG, Averager, frame_bytes, two_step_link_bytes

__all__ = ["AVERAGE_TAG", "Averager", "frame_bytes", "two_step_link_bytes"]
