"""The maths of one SwarmSGD interaction: quantized snapshots and the non-blocking pairwise average.

Pure (numpy); the node (:mod:`squall.protocols.swarm.node`) applies it when messages arrive.

Non-blocking average. Node ``i`` takes a snapshot ``s_i`` of its model, sends it to ``j``, and
keeps training while the message travels; ``j`` answers with its own snapshot ``s_j``. Let
``Q(s)`` be a snapshot as the partner reconstructs it (the lattice point ``eps k``, or ``s`` in
full precision). Both nodes know both ``Q(s_i)`` and ``Q(s_j)`` exactly. When the partner's
snapshot arrives, node ``i`` (whose model has meanwhile become ``x_i``) sets::

    x_i <- (Q(s_i) + Q(s_j)) / 2 + (x_i - Q(s_i))        # average, plus the local progress since
         = x_i + (Q(s_j) - Q(s_i)) / 2                    # i.e. add half the snapshots' difference

and node ``j`` symmetrically adds ``(Q(s_i) - Q(s_j)) / 2``. The two increments cancel, so the
sum of all models (hence their mean, which SGD drives) is **exactly** unchanged by every
interaction, quantized or not, however long the messages took and whatever else either node did
meanwhile. With no local progress both nodes end at the same point ``(Q(s_i) + Q(s_j)) / 2``.
The paper writes the delta against ``s_i`` instead of ``Q(s_i)``; the two differ by the
rounding error ``s_i - Q(s_i)`` (at most ``eps / 2`` per coordinate), and this form is the one
that keeps the sum exact.

Reference points. The initiator encodes ``s_i`` against the responder's *current model* (which
it cannot see: it estimates the distance from earlier exchanges and picks ``eps`` with a safety
factor; a failed checksum makes the responder ask for full precision). The responder encodes
``s_j`` against ``Q(s_i)``, which it knows exactly, so it can choose ``eps`` from the true
distance and verify the decode before sending: an answer never fails.

Mixing weights. Write one interaction as ``x_i <- x_i + (s_j - s_i) / 2``. If a node answers one
offer while its own offer is in flight (snapshot ``s_i``, current model ``x_i ~ s_i``), it ends
at ``s_i + (s_k - s_i)/2 + (s_j - s_i)/2 = (s_k + s_j) / 2``: weight 0 on itself, still a convex
combination. A second overlapping answer would give itself weight ``-1/4``; so a node answers
at most ``max_overlap = 1`` offer while its own is in flight and says BUSY to the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from squall.protocols.swarm.frames import Floats32, Vector
from squall.training.compress.lattice import FULL_BITS, Encoded, decode, encode, quantize, spacing_for


@dataclass(frozen=True)
class QuantizerConfig:
    """How snapshots are encoded."""

    bits: int = 8  # 4 or 8: lattice codes; 32: full precision (float32)
    eps: float | None = None  # fixed lattice spacing; None: chosen per message from the distance
    offer_safety: float = 2.0  # initial radius / estimated distance for offers (grows after failures)
    answer_safety: float = 1.25  # radius / true distance for answers
    eps_min: float = 1e-7  # smallest spacing (identical models would otherwise give eps = 0)

    def __post_init__(self) -> None:
        if self.bits not in (4, 8, FULL_BITS):
            raise ValueError(f"bits must be 4, 8 or 32, got {self.bits}")
        if self.eps is not None and not self.eps > 0:
            raise ValueError(f"eps must be > 0 or None, got {self.eps}")
        for name in ("offer_safety", "answer_safety"):
            if not getattr(self, name) > 1:
                raise ValueError(f"{name} must be > 1, got {getattr(self, name)}")
        if not self.eps_min > 0:
            raise ValueError(f"eps_min must be > 0, got {self.eps_min}")

    @property
    def quantized(self) -> bool:
        """True when snapshots go on the lattice."""
        return self.bits != FULL_BITS


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A snapshot ready to send: the wire vector and the value the partner will reconstruct."""

    vector: Vector  # what goes into the frame
    point: Floats32  # Q(s): exactly what a successful decode on the other side yields


def full_precision(snapshot: npt.ArrayLike) -> Outgoing:
    """Send ``snapshot`` as raw float32: ``Q(s) = s``."""
    raw = np.ascontiguousarray(snapshot, dtype=np.float32).reshape(-1).copy()
    return Outgoing(raw, raw)


def on_lattice(snapshot: npt.ArrayLike, eps: float, bits: int) -> Outgoing:
    """Encode ``snapshot`` with spacing ``eps``; ``Q(s) = float32(eps * rint(s / eps))``."""
    encoded = encode(snapshot, eps, bits)
    return Outgoing(encoded, quantize(snapshot, eps).astype(np.float32))


def offer(snapshot: npt.ArrayLike, config: QuantizerConfig, distance: float | None, safety: float) -> Outgoing:
    """The initiator's snapshot, encoded for a receiver believed to be within ``distance`` (sup norm).

    Full precision when quantization is off, or when no distance is known yet and no fixed
    ``eps`` is configured (the first exchange measures it).
    """
    if not config.quantized:
        return full_precision(snapshot)
    if config.eps is not None:
        return on_lattice(snapshot, config.eps, config.bits)
    if distance is None:
        return full_precision(snapshot)
    return on_lattice(snapshot, spacing_for(distance, config.bits, safety=safety, eps_min=config.eps_min), config.bits)


def answer(snapshot: npt.ArrayLike, config: QuantizerConfig, reference: Floats32) -> tuple[Outgoing, float]:
    """The responder's snapshot, encoded against the initiator's ``Q(s_i)``, and their sup distance.

    The decode is checked here, before sending; if it would fail (a fixed ``eps`` too small for the
    distance), the snapshot goes in full precision instead, so an answer always decodes.
    """
    s = np.asarray(snapshot, dtype=np.float32).reshape(-1)
    distance = sup_distance(s, reference)
    if not config.quantized:
        return full_precision(s), distance
    eps = config.eps
    if eps is None:
        eps = spacing_for(distance, config.bits, safety=config.answer_safety, eps_min=config.eps_min)
    out = on_lattice(s, eps, config.bits)
    if not receive(out.vector, reference).ok:
        return full_precision(s), distance
    return out, distance


@dataclass(frozen=True, slots=True)
class Received:
    """A partner's snapshot as reconstructed here."""

    point: Floats32 | None  # Q(s_partner), or None when the lattice decode failed its checksum
    bits: int  # what it cost per coordinate

    @property
    def ok(self) -> bool:
        """True when ``point`` is the partner's exact ``Q(s)``."""
        return self.point is not None


def receive(vector: Vector, reference: npt.ArrayLike) -> Received:
    """Reconstruct a partner's snapshot against ``reference`` (this node's reference point)."""
    if not isinstance(vector, Encoded):
        return Received(np.asarray(vector, dtype=np.float32), FULL_BITS)
    decoded = decode(vector, np.asarray(reference, dtype=np.float32).astype(np.float64))
    return Received(decoded.values.astype(np.float32) if decoded.ok else None, vector.bits)


def increment(theirs: Floats32, mine: Floats32) -> Floats32:
    """``(Q(s_partner) - Q(s_own)) / 2``: what this node adds to its current model."""
    return ((theirs.astype(np.float64) - mine.astype(np.float64)) / 2).astype(np.float32)


def sup_distance(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """``||a - b||_inf`` in float64."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return float(np.abs(diff).max()) if diff.size else 0.0
