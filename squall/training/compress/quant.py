"""Group-wise asymmetric integer quantization (INT8 / INT4), as Flash Communication quantizes activations.

The vector is cut into groups of ``group`` consecutive elements (the last one may be shorter).
Each group ``G`` gets a zero point ``z = min G`` and a scale ``s = (max G - z) / (2^b - 1)``, both
stored as float16, and every element becomes a ``b``-bit code::

    c = clip(rint((x - z) / s), 0, 2^b - 1)        x' = z + c s

so ``|x - x'| <= s / 2`` per element: the error is relative to each group's own range, which is
why fine groups (128) keep INT8 within about 1 % and INT4 within about 15 % of a Gaussian's norm.
``z`` is rounded down and ``s`` up to float16 so that no element is clipped by the rounding.

Wire bytes: ``b/8`` per element plus 4 per group (two float16): INT8 with groups of 128 is
0.258 of float32, INT4 0.133 (docs/protocols/README.md, compressed payloads). 4-bit codes are packed two per byte
(:func:`~squall.training.compress.lattice.pack_codes`).

Quantized payloads cannot be added without decoding them (:attr:`GroupQuant.summable` is false):
:func:`squall.collectives.allreduce` runs Flash Communication's two-step all-reduce with them
(each element quantized twice), or the ring that requantizes at every hop.

Payload: parameters ``bits`` (4 or 8) and ``group``; arrays ``codes`` (uint8, packed),
``scales`` and ``zeros`` (float16, one per group). The receiver rejects other bit widths, a group
size out of range, a count of scales or zeros that does not match ``ceil(numel / group)`` (group
metadata that does not fit the tensor), a negative scale and a nonzero padding nibble.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Guarantees, Indices
from squall.training.compress.lattice import pack_codes, packed_size, unpack_codes
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

#: Bit widths of the group quantizer.
QUANT_BITS = (4, 8)
#: Largest group size a payload may claim.
MAX_GROUP = 1 << 24
#: Largest magnitude a float16 scale or zero point holds.
FLOAT16_MAX = float(np.finfo(np.float16).max)

Floats = npt.NDArray[np.float32]


def groups_of(numel: int, group: int) -> int:
    """Groups of ``group`` elements covering ``numel`` (the last one possibly short)."""
    return -(-numel // group)


def check_settings(bits: int, group: int) -> None:
    """Raise ValueError unless ``bits`` is 4 or 8 and ``group`` in ``[1, 2**24]``."""
    if bits not in QUANT_BITS:
        raise ValueError(f"groupquant: bits must be one of {QUANT_BITS}, got {bits}")
    if not 1 <= group <= MAX_GROUP:
        raise ValueError(f"groupquant: group must be in [1, {MAX_GROUP}], got {group}")


@dataclass(frozen=True, slots=True)
class Quantized:
    """A vector quantized per group (codes unpacked, one per element)."""

    codes: npt.NDArray[np.uint8]  # one code per element, < 2**bits
    scales: npt.NDArray[np.float16]  # one per group, >= 0
    zeros: npt.NDArray[np.float16]  # one per group
    bits: int
    group: int


def quantize(x: npt.ArrayLike, bits: int, group: int) -> Quantized:
    """Group-wise asymmetric quantization of the 1-d ``x`` (see the module docstring).

    :raises ValueError: bad settings, a non-finite ``x``, or a group whose zero point or scale
        does not fit float16.
    """
    check_settings(bits, group)
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        raise ValueError("groupquant: vector is not finite")
    n, levels = flat.size, (1 << bits) - 1
    count = groups_of(n, group)
    if n == 0:
        empty16 = np.zeros(0, dtype=np.float16)
        return Quantized(np.zeros(0, dtype=np.uint8), empty16, empty16, bits, group)
    padded = np.pad(flat, (0, count * group - n), mode="edge").reshape(count, group)
    lo, hi = padded.min(axis=1), padded.max(axis=1)
    if max(float(np.abs(lo).max()), float(np.abs(hi).max())) > FLOAT16_MAX / 2:
        raise ValueError(f"groupquant: values beyond +-{FLOAT16_MAX / 2:g} do not fit float16 scales")
    zeros = lo.astype(np.float16)
    up = zeros.astype(np.float32) > lo  # round the zero point down: no element below it
    zeros[up] = np.nextafter(zeros[up], np.float16(-np.inf))
    z32 = zeros.astype(np.float32)
    wanted = (hi - z32) / levels
    scales = wanted.astype(np.float16)
    short = scales.astype(np.float32) < wanted  # round the scale up: no element above the top code
    scales[short] = np.nextafter(scales[short], np.float16(np.inf))
    s32 = scales.astype(np.float32)
    safe = np.where(s32 > 0, s32, np.float32(1.0))
    codes = np.rint((padded - z32[:, None]) / safe[:, None])
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(-1)[:n]
    return Quantized(codes, scales, zeros, bits, group)


def dequantize(q: Quantized) -> Floats:
    """``z + c s`` per element, float32."""
    n = q.codes.size
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    count = q.scales.size
    codes = np.zeros(count * q.group, dtype=np.float32)  # the last group padded: one float32 per element
    codes[:n] = q.codes
    blocks = codes.reshape(count, q.group)
    blocks *= q.scales.astype(np.float32)[:, None]
    blocks += q.zeros.astype(np.float32)[:, None]
    return codes[:n]


def round_trip(x: npt.ArrayLike, bits: int, group: int) -> Floats:
    """``dequantize(quantize(x))``: what a receiver reconstructs."""
    return dequantize(quantize(x, bits, group))


def _check_params(numel: int, params: Params) -> None:
    if params["bits"] not in QUANT_BITS:
        raise WireError(f"groupquant: bits must be one of {QUANT_BITS}, got {params['bits']}")
    if not 1 <= params["group"] <= MAX_GROUP:
        raise WireError(f"groupquant: group must be in [1, {MAX_GROUP}], got {params['group']}")


def _check_payload(payload: CompressedPayload) -> None:
    scales = payload.arrays["scales"]
    if scales.size and float(scales.min()) < 0:
        raise WireError("groupquant: a group's scale is negative")
    codes = payload.arrays["codes"]
    if payload.params["bits"] == 4 and payload.numel % 2 and codes.size and int(codes[-1]) >> 4:
        raise WireError("groupquant: nonzero padding nibble after the last 4-bit code")


def _groups(numel: int, p: Params) -> int:
    return groups_of(numel, int(p["group"]))


SCHEMA = PayloadSchema(
    compressor="groupquant",
    params=(("bits", ParamKind.U64), ("group", ParamKind.U64)),
    arrays=(
        ArraySpec("codes", np.dtype(np.uint8), count=lambda numel, p: packed_size(numel, int(p["bits"]))),
        ArraySpec("scales", np.dtype(np.float16), count=_groups),
        ArraySpec("zeros", np.dtype(np.float16), count=_groups),
    ),
    check_params=_check_params,
    check=_check_payload,
)


def to_payload(q: Quantized) -> CompressedPayload:
    """The wire payload of a quantized vector (codes packed)."""
    return CompressedPayload(
        GroupQuant.name,
        int(q.codes.size),
        {"bits": q.bits, "group": q.group},
        {"codes": pack_codes(q.codes, q.bits), "scales": q.scales, "zeros": q.zeros},
    )


def from_payload(payload: CompressedPayload) -> Quantized:
    """The quantized vector in a (validated) payload."""
    bits, group = int(payload.params["bits"]), int(payload.params["group"])
    codes = unpack_codes(np.asarray(payload.arrays["codes"], dtype=np.uint8), bits, payload.numel)
    return Quantized(codes, np.asarray(payload.arrays["scales"]), np.asarray(payload.arrays["zeros"]), bits, group)


class GroupQuant(Compressor):
    """INT8 / INT4 with a float16 scale and zero point per group (see the module docstring).

    :param bits: 8 or 4.
    :param group: elements per group (128 by default, as in the paper's kernels).
    """

    name: ClassVar[str] = "groupquant"
    schema: ClassVar[PayloadSchema] = SCHEMA
    summable: ClassVar[bool] = False
    indices: ClassVar[Indices] = "none"

    def __init__(self, *, bits: int = 8, group: int = 128) -> None:
        check_settings(bits, group)
        self.bits, self.group = bits, group

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> GroupQuant:
        """A quantizer with the payload's bits and group size."""
        return cls(bits=int(payload.params["bits"]), group=int(payload.params["group"]))

    @property
    def guarantees(self) -> Guarantees:
        """Deterministic rounding: biased, error at most half a step of each group's scale."""
        return Guarantees(
            unbiased=False,
            contractive=False,
            delta=None,
            error_bound="|x - x'| <= s/2 per element, s = the group's (max - min) / (2**bits - 1) (rounded up)",
        )

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """Codes, scales and zero points of the 1-d ``x``."""
        return to_payload(quantize(x, self.bits, self.group))

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """``z + c s`` per element (``reference`` is not needed)."""
        self._own(payload)
        return Decoded(values=dequantize(from_payload(payload)), ok=True)

    @property
    def group_size(self) -> int:
        """``group``: an all-reduce cuts the vector on group boundaries."""
        return self.group

    def mismatch(self, payload: CompressedPayload) -> str | None:
        """A payload quantized with other bits or another group size than this quantizer's."""
        bits, group = int(payload.params["bits"]), int(payload.params["group"])
        if bits == self.bits and group == self.group:
            return None
        return f"quantized with {bits} bits in groups of {group}, expected {self.bits} bits in groups of {self.group}"

    def wire_bytes(self, numel: int) -> int:
        """Header, two parameters, ``numel bits / 8`` bytes of codes and 4 bytes per group."""
        count = groups_of(numel, self.group)
        return wire_size(self.schema, [packed_size(numel, self.bits), count, count])

    def error_bound(self, payload: CompressedPayload) -> float:
        """Half the largest scale (plus float32 rounding of ``z + c s``)."""
        scales = payload.arrays["scales"]
        if not scales.size:
            return 0.0
        top = float(np.abs(payload.arrays["zeros"].astype(np.float32)).max()) + float(scales.max()) * 255
        return float(scales.astype(np.float32).max()) / 2 + top * 2.0**-23
