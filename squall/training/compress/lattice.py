"""The reference-point (modular lattice) quantizer: encode a vector relative to the receiver's model.

SwarmSGD's quantizer (Nadiradze et al.), a shared part: the pure functions below, and
:class:`LatticeCompressor`, the same scheme behind the :class:`~squall.training.compress.Compressor`
interface (its payload: ``bits``, ``eps``, ``checksum`` and the packed ``codes``).

Lattice. Fix a spacing ``eps > 0`` and ``b`` bits, ``q = 2**b``. The sender rounds ``x`` to the
lattice ``eps Z^d`` and sends only each coordinate's residue modulo ``q``::

    k = rint(x / eps)          (int64, the lattice point; |x - eps k| <= eps/2 per coordinate)
    c = k mod q                (in [0, q): b bits per coordinate on the wire)

Decoding. The receiver knows ``c`` and ``eps`` and holds a *reference point* ``y`` close to ``x``
(its own model). Among the integers congruent to ``c`` modulo ``q`` it picks the one nearest to
``y / eps``::

    m   = rint((y / eps - c) / q)
    k'  = c + q m
    x'  = eps k'

Correctness radius. ``k' = k`` iff ``k`` is the residue-``c`` integer nearest to ``y/eps``, which
holds when ``|y/eps - k| < q/2`` (a strict inequality: at exactly ``q/2`` two candidates tie).
Since ``|x/eps - k| <= 1/2``, the triangle inequality gives ``|y/eps - k| <= |y - x|/eps + 1/2``,
so decoding is exact on every coordinate where::

    |x - y| < (q - 1) eps / 2  =:  radius(eps, b)

and there ``|x - x'| = |x - eps k| <= eps/2``. Conversely, where ``|x - y| > (q + 1) eps / 2`` we
have ``|y/eps - k| > q/2``, so ``k' != k``: decoding is wrong by a multiple of ``q eps``.

Detecting failure. The receiver cannot see ``k``, but the sender can send a 64-bit digest of it
(:func:`lattice_checksum`, BLAKE2b over the little-endian ``int64`` values): the receiver digests
its ``k'``; equal digests mean ``k' = k`` on every coordinate (a false accept needs a BLAKE2b
collision, probability about 2**-64). On a mismatch the exchange falls back to full precision.

Cost. ``b`` bits per coordinate plus a fixed header, i.e. ``b / 32`` of float32; 4-bit codes are
packed two per byte (:func:`pack_codes`). Choosing ``eps``: to make a reference at distance ``d``
(sup norm) decodable with a safety factor ``s > 1``, take ``eps = 2 s d / (q - 1)``
(:func:`spacing_for`); the error is then ``eps / 2 = s d / (q - 1)``, proportional to how far
apart the models are, not to their size: this is why SwarmSGD quantizes relative to a reference.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Guarantees, Indices
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

#: Bit widths the lattice codec supports (32 means "no quantization": raw float32).
LATTICE_BITS = (4, 8)
FULL_BITS = 32

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Codes = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A vector encoded on the lattice: what goes on the wire (before packing)."""

    codes: Codes  # residues k mod q, one per coordinate, each < 2**bits
    bits: int  # b: 4 or 8
    eps: float  # lattice spacing
    checksum: int  # lattice_checksum(k): lets the receiver detect a wrong decode

    @property
    def modulus(self) -> int:
        """``q = 2**bits``."""
        return 1 << self.bits


def _check_bits(bits: int) -> int:
    if bits not in LATTICE_BITS:
        raise ValueError(f"lattice bits must be one of {LATTICE_BITS}, got {bits}")
    return 1 << bits


#: Largest lattice coordinate decoded: integers up to 2**62 stay exact through ``c + q m`` in int64.
MAX_LATTICE_INDEX = float(2**62)


def _check_eps(eps: float) -> None:
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"lattice spacing eps must be finite and > 0, got {eps}")


def radius(eps: float, bits: int) -> float:
    """``(q - 1) eps / 2``: decoding is exact wherever ``|x - y|`` is strictly below it."""
    q = _check_bits(bits)
    _check_eps(eps)
    return (q - 1) * eps / 2


def spacing_for(distance: float, bits: int, *, safety: float = 2.0, eps_min: float = 1e-8) -> float:
    """The spacing whose radius is ``safety x distance`` (at least ``eps_min``).

    With ``safety > 1`` a reference within ``distance`` (sup norm) of the vector decodes exactly.
    """
    q = _check_bits(bits)
    if not safety > 1:
        raise ValueError(f"safety must be > 1, got {safety}")
    if not (math.isfinite(distance) and distance >= 0):
        raise ValueError(f"distance must be finite and >= 0, got {distance}")
    return max(eps_min, 2.0 * safety * distance / (q - 1))


def lattice_point(x: npt.ArrayLike, eps: float) -> Ints:
    """``rint(x / eps)`` as int64 (round half to even)."""
    _check_eps(eps)
    scaled = np.asarray(x, dtype=np.float64) / eps
    if not np.isfinite(scaled).all() or (scaled.size and float(np.abs(scaled).max()) >= 2.0**62):
        raise ValueError(f"vector does not fit the lattice of spacing {eps} (non-finite or too large)")
    return np.rint(scaled).astype(np.int64)


def lattice_checksum(k: Ints) -> int:
    """64-bit BLAKE2b digest of the lattice point ``k`` (little-endian int64 bytes)."""
    data = np.ascontiguousarray(k, dtype="<i8").tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def encode(x: npt.ArrayLike, eps: float, bits: int) -> Encoded:
    """Residues of ``x``'s lattice point modulo ``2**bits``, with its checksum."""
    q = _check_bits(bits)
    k = lattice_point(x, eps)
    codes = np.mod(k, q).astype(np.uint8)
    return Encoded(codes=codes, bits=bits, eps=float(eps), checksum=lattice_checksum(k))


def decode_point(codes: Codes, eps: float, bits: int, reference: npt.ArrayLike) -> Ints:
    """``k'``: the integer congruent to each code modulo ``q`` that is nearest to ``reference / eps``."""
    q = _check_bits(bits)
    _check_eps(eps)
    ref = np.asarray(reference, dtype=np.float64)
    c = np.asarray(codes).astype(np.int64)
    if ref.shape != c.shape:
        raise ValueError(f"reference has shape {ref.shape}, codes {c.shape}")
    if not np.isfinite(ref).all():
        raise ValueError("reference is not finite")
    with np.errstate(over="ignore", invalid="ignore"):
        m = np.rint((ref / eps - c) / q)
    if not (np.isfinite(m).all() and np.abs(m).max(initial=0.0) <= MAX_LATTICE_INDEX / q):
        raise OverflowError(f"the reference is beyond the lattice's integer range at spacing eps={eps:g}")
    return c + q * m.astype(np.int64)


def decode(encoded: Encoded, reference: npt.ArrayLike) -> Decoded:
    """Reconstruct against ``reference`` and check the result against the sender's checksum.

    ``values`` is ``eps * k'`` (float64); ``ok`` says the digest of ``k'`` matched the sender's
    checksum, i.e. ``values`` is the sender's lattice point. A spacing so small that the reference's
    lattice coordinates leave the 64-bit range cannot be the sender's either: ``ok`` is False and
    ``values`` is the reference, as for any other failed decode.
    """
    try:
        k = decode_point(encoded.codes, encoded.eps, encoded.bits, reference)
    except OverflowError:
        return Decoded(values=np.array(reference, dtype=np.float64), ok=False)
    return Decoded(values=k.astype(np.float64) * encoded.eps, ok=lattice_checksum(k) == encoded.checksum)


def quantize(x: npt.ArrayLike, eps: float) -> Floats:
    """``eps * rint(x / eps)``: the value a successful decode yields (what the sender averages with)."""
    return lattice_point(x, eps).astype(np.float64) * eps


def packed_size(count: int, bits: int) -> int:
    """Bytes of ``count`` packed codes of ``bits`` bits."""
    _check_bits(bits)
    return (count * bits + 7) // 8


def pack_codes(codes: Codes, bits: int) -> Codes:
    """Codes as bytes: one per byte at 8 bits; two per byte at 4 bits (low nibble first)."""
    q = _check_bits(bits)
    flat = np.asarray(codes, dtype=np.uint8).reshape(-1)
    if flat.size and int(flat.max()) >= q:
        raise ValueError(f"a code is >= 2**{bits}")
    if bits == 8:
        return flat.copy()
    padded = np.zeros(flat.size + flat.size % 2, dtype=np.uint8)
    padded[: flat.size] = flat
    return (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8)


def unpack_codes(data: Codes, bits: int, count: int) -> Codes:
    """Inverse of :func:`pack_codes` for ``count`` codes; rejects a wrong length or nonzero padding."""
    _check_bits(bits)
    raw = np.asarray(data, dtype=np.uint8).reshape(-1)
    if raw.size != packed_size(count, bits):
        raise ValueError(f"{raw.size} bytes cannot hold exactly {count} codes of {bits} bits")
    if bits == 8:
        return raw.copy()
    out = np.empty(raw.size * 2, dtype=np.uint8)
    out[0::2] = raw & 0x0F
    out[1::2] = raw >> 4
    if count % 2 and out[-1] != 0:
        raise ValueError("nonzero padding nibble after the last 4-bit code")
    return out[:count]


def _check_params(numel: int, params: Params) -> None:
    """The receiver's checks of a lattice payload's parameters."""
    if params["bits"] not in LATTICE_BITS:
        raise WireError(f"lattice: bits must be one of {LATTICE_BITS}, got {params['bits']}")
    if not params["eps"] > 0:
        raise WireError(f"lattice: lattice spacing eps must be finite and > 0, got {params['eps']}")


def _check_padding(payload: CompressedPayload) -> None:
    """An odd number of 4-bit codes leaves a high nibble that must be zero (one encoding per vector)."""
    codes = payload.arrays["codes"]
    if payload.params["bits"] == 4 and payload.numel % 2 and codes.size and int(codes[-1]) >> 4:
        raise WireError("lattice: nonzero padding nibble after the last 4-bit code")


class LatticeCompressor(Compressor):
    """:func:`encode`/:func:`decode` as a :class:`~squall.training.compress.Compressor`.

    :param bits: 4 or 8 bits per coordinate.
    :param eps: the lattice spacing (SwarmSGD picks one per message: :func:`spacing_for`).
    """

    name: ClassVar[str] = "lattice"
    summable: ClassVar[bool] = False  # and it decodes against the receiver's reference: no all-reduce takes it
    indices: ClassVar[Indices] = "none"
    schema: ClassVar[PayloadSchema] = PayloadSchema(
        compressor="lattice",
        params=(("bits", ParamKind.U64), ("eps", ParamKind.F64), ("checksum", ParamKind.U64)),
        arrays=(ArraySpec("codes", np.dtype(np.uint8), count=lambda numel, p: packed_size(numel, int(p["bits"]))),),
        check_params=_check_params,
        check=_check_padding,
    )

    def __init__(self, *, bits: int, eps: float) -> None:
        _check_bits(bits)
        _check_eps(eps)
        self.bits = bits
        self.eps = float(eps)

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> LatticeCompressor:
        """A lattice with the payload's bits and spacing."""
        return cls(bits=int(payload.params["bits"]), eps=float(payload.params["eps"]))

    @property
    def guarantees(self) -> Guarantees:
        """Deterministic rounding; exact within the radius, detected (``ok`` False) outside it."""
        return Guarantees(
            unbiased=False,
            contractive=False,
            delta=None,
            error_bound="|x - x'| <= eps/2 per coordinate when |x - reference| < (2**bits - 1) eps/2; "
            "otherwise decoding fails, detected by the checksum",
            needs_reference=True,
        )

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """Codes of ``x`` on this lattice, packed, with the checksum."""
        return to_payload(encode(x, self.eps, self.bits))

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """Reconstruct against ``reference`` (required), with the payload's own bits and spacing."""
        self._own(payload)
        if reference is None:
            raise ValueError("the lattice decodes relative to the receiver's reference vector: pass reference=")
        return decode(from_payload(payload), reference)

    def wire_bytes(self, numel: int) -> int:
        """Header, three parameters and ``ceil(numel bits / 8)`` bytes of codes."""
        return wire_size(self.schema, [packed_size(numel, self.bits)])

    def error_bound(self, payload: CompressedPayload) -> float:
        """``eps / 2`` of the payload (for a decode that is ok)."""
        return float(payload.params["eps"]) / 2


def to_payload(encoded: Encoded) -> CompressedPayload:
    """The wire payload of a lattice-encoded vector (codes packed)."""
    params = {"bits": encoded.bits, "eps": encoded.eps, "checksum": encoded.checksum}
    codes = pack_codes(encoded.codes, encoded.bits)
    return CompressedPayload(LatticeCompressor.name, int(encoded.codes.size), params, {"codes": codes})


def from_payload(payload: CompressedPayload) -> Encoded:
    """The lattice-encoded vector in a (validated) payload."""
    bits = int(payload.params["bits"])
    codes = unpack_codes(np.asarray(payload.arrays["codes"], dtype=np.uint8), bits, payload.numel)
    return Encoded(codes=codes, bits=bits, eps=float(payload.params["eps"]), checksum=int(payload.params["checksum"]))
