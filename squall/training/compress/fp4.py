"""4-bit floating point E3M0 (1 sign bit, 3 exponent bits, no mantissa): Streaming DiLoCo's outer gradients.

Streaming DiLoCo sends each replica's outer gradient in FP4 E3M0 and sums in float32; the paper
names the format (after the "exmy" library) but not how values are scaled or rounded, so this
module decides, and says so:

* **Levels.** A 4-bit code is ``s eee``: ``s`` the sign (bit 3), ``eee`` an exponent code
  ``e`` in 0..7. ``e = 0`` is zero (no mantissa, so no subnormals); ``e = 1..7`` stands for
  ``2**(e - 7)``, the magnitudes ``1/64, 1/32, ..., 1/2, 1``: seven powers of two and zero. The
  code ``1000`` (a negative zero) is not produced and is rejected on receipt, so every value has
  one code.
* **Scaling.** The vector is cut into groups of ``group`` consecutive elements (the last may be
  shorter); each group's scale is its largest magnitude, sent as float32. An element is coded as
  ``|x| / scale`` in [0, 1] and decoded as ``sign x scale x level``: the largest element of a group
  is exact, and anything below ``scale / 128`` can only become 0 or ``scale / 64``.
* **Rounding.** ``nearest`` (default): to the nearest level in value (between ``2**k`` and
  ``2**(k+1)`` the cut is at ``1.5 x 2**k``; between 0 and 1/64 at 1/128), deterministic, error at
  most a quarter of the group's scale. ``stochastic``: up to the next level with probability
  ``(m - lower) / (upper - lower)``, so ``E[decode] = x`` (unbiased), from a generator seeded by the
  compressor's ``seed`` and advanced at every call; error below half the scale.

Wire bytes: half a byte per element (two codes per byte, low nibble first) plus 4 per group:
0.531 bytes per element with groups of 128, 7.5x less than float32 and 3.8x less than bf16.

Payload: parameter ``group``; arrays ``codes`` (uint8, packed) and ``scales`` (float32, one per
group). The receiver rejects a group size out of range, a count of scales that does not match
``ceil(numel / group)``, a scale that is negative or not finite, a negative-zero code and a
nonzero padding nibble.
"""

from __future__ import annotations

from typing import ClassVar, Final

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Guarantees, Indices
from squall.training.compress.lattice import pack_codes, packed_size, unpack_codes
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

NAME: Final = "fp4_e3m0"
ROUNDINGS: Final = ("nearest", "stochastic")
#: Largest group size a payload may claim.
MAX_GROUP: Final = 1 << 24
#: The exponent code of the level 1 (the group's scale): levels are 2**(e - TOP), e = 1..TOP.
TOP: Final = 7
SIGN: Final = 0x8
#: Levels by exponent code: 0 for e = 0, then 1/64 .. 1.
LEVELS: Final = np.array([0.0] + [2.0 ** (e - TOP) for e in range(1, TOP + 1)], dtype=np.float32)

Floats = npt.NDArray[np.float32]


def groups_of(numel: int, group: int) -> int:
    """Groups of ``group`` elements covering ``numel``."""
    return -(-numel // group)


def _check_group(group: int) -> None:
    if not 1 <= group <= MAX_GROUP:
        raise ValueError(f"{NAME}: group must be in [1, {MAX_GROUP}], got {group}")


def _scales(flat: Floats, group: int) -> tuple[Floats, Floats]:
    """Each group's largest magnitude, and that scale per element."""
    count = groups_of(flat.size, group)
    padded = np.zeros(count * group, dtype=np.float32)
    padded[: flat.size] = np.abs(flat)
    scales = padded.reshape(count, group).max(axis=1)
    return scales, np.repeat(scales, group)[: flat.size]


def exponent_codes(m: Floats, rounding: str, rng: np.random.Generator | None = None) -> npt.NDArray[np.uint8]:
    """Exponent codes (0..7) of the magnitudes ``m`` in [0, 1] (see the module docstring)."""
    safe = np.where(m > 0, m, 1.0)
    k = np.clip(np.floor(np.log2(safe)), -TOP, 0)  # the level 2**k just below m (k = -7: below 1/64)
    lower = np.where(k > -TOP, np.exp2(k), 0.0)  # below 1/64 the level beneath is zero
    upper = np.where(k > -TOP, np.exp2(np.minimum(k + 1, 0)), 2.0**(1 - TOP))
    if rounding == "nearest":
        up = m >= (lower + upper) / 2
    else:
        assert rng is not None
        gap = np.where(upper > lower, upper - lower, 1.0)
        up = rng.random(m.size) < (m - lower) / gap
    exponent = np.where(k > -TOP, k + TOP, 0) + up * np.where(k < 0, 1, 0)
    return np.where(m > 0, exponent, 0).astype(np.uint8)


def encode_codes(x: npt.ArrayLike, group: int, rounding: str = "nearest",
                 rng: np.random.Generator | None = None) -> tuple[npt.NDArray[np.uint8], Floats]:
    """4-bit codes (unpacked, one per element) and float32 scales of the 1-d ``x``."""
    _check_group(group)
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        raise ValueError(f"{NAME}: vector is not finite")
    scales, per_element = _scales(flat, group)
    m = np.divide(np.abs(flat), per_element, out=np.zeros_like(flat), where=per_element > 0)
    exponent = exponent_codes(np.minimum(m, 1.0), rounding, rng)
    sign = ((flat < 0) & (exponent > 0)).astype(np.uint8) * SIGN
    return (exponent | sign).astype(np.uint8), scales


def decode_codes(codes: npt.NDArray[np.uint8], scales: Floats, group: int) -> Floats:
    """``sign x scale x level`` per element, float32."""
    n = codes.size
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    magnitude = LEVELS[codes & 0x7] * np.repeat(scales.astype(np.float32), group)[:n]
    out: Floats = np.where(codes & SIGN, -magnitude, magnitude).astype(np.float32)
    return out


def _check_params(numel: int, params: Params) -> None:
    if not 1 <= params["group"] <= MAX_GROUP:
        raise WireError(f"{NAME}: group must be in [1, {MAX_GROUP}], got {params['group']}")


def _check_payload(payload: CompressedPayload) -> None:
    scales = payload.arrays["scales"]
    if scales.size and not (np.isfinite(scales).all() and float(scales.min()) >= 0):
        raise WireError(f"{NAME}: a group's scale is negative or not finite")
    try:
        codes = unpack_codes(np.asarray(payload.arrays["codes"], dtype=np.uint8), 4, payload.numel)
    except ValueError as exc:
        raise WireError(f"{NAME}: {exc}") from None
    if np.any(codes == SIGN):
        raise WireError(f"{NAME}: a negative-zero code (1000) is not a canonical FP4 E3M0 value")


def _groups(numel: int, p: Params) -> int:
    return groups_of(numel, int(p["group"]))


SCHEMA: Final = PayloadSchema(
    compressor=NAME,
    params=(("group", ParamKind.U64),),
    arrays=(
        ArraySpec("codes", np.dtype(np.uint8), count=lambda numel, p: packed_size(numel, 4)),
        ArraySpec("scales", np.dtype(np.float32), count=_groups),
    ),
    check_params=_check_params,
    check=_check_payload,
)


class Fp4E3M0(Compressor):
    """FP4 E3M0 with a float32 absmax scale per group (see the module docstring).

    :param group: elements per scale (128 by default).
    :param rounding: ``nearest`` or ``stochastic`` (the encoder's choice; the payload does not say).
    :param seed: the stochastic rounding's generator seed.
    """

    name: ClassVar[str] = NAME
    schema: ClassVar[PayloadSchema] = SCHEMA
    summable: ClassVar[bool] = False  # codes of two ranks do not add: an all-reduce decodes them (two-step)
    indices: ClassVar[Indices] = "none"

    def __init__(self, *, group: int = 128, rounding: str = "nearest", seed: int = 0) -> None:
        _check_group(group)
        if rounding not in ROUNDINGS:
            raise ValueError(f"{NAME}: rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self.group, self.rounding = group, rounding
        self._rng = np.random.default_rng(seed)

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> Fp4E3M0:
        """A decoder with the payload's group size."""
        return cls(group=int(payload.params["group"]))

    @property
    def guarantees(self) -> Guarantees:
        """Stochastic rounding is unbiased; nearest is not. Neither is contractive in general."""
        bound = "scale/4" if self.rounding == "nearest" else "scale/2"
        return Guarantees(unbiased=self.rounding == "stochastic", contractive=False, delta=None,
                          error_bound=f"|x - x'| <= {bound} per element, scale = the group's largest |x|")

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """Codes and scales of the 1-d ``x``."""
        codes, scales = encode_codes(x, self.group, self.rounding, self._rng)
        return CompressedPayload(NAME, int(codes.size), {"group": self.group},
                                 {"codes": pack_codes(codes, 4), "scales": scales})

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """``sign x scale x level`` per element (``reference`` is not needed)."""
        self._own(payload)
        codes = unpack_codes(np.asarray(payload.arrays["codes"], dtype=np.uint8), 4, payload.numel)
        scales = np.asarray(payload.arrays["scales"], dtype=np.float32)
        return Decoded(values=decode_codes(codes, scales, int(payload.params["group"])), ok=True)

    @property
    def group_size(self) -> int:
        """``group``: an all-reduce cuts the vector on group boundaries, so every segment has whole scales."""
        return self.group

    def mismatch(self, payload: CompressedPayload) -> str | None:
        """A payload with another group size than this encoder's."""
        group = int(payload.params["group"])
        return None if group == self.group else f"FP4 E3M0 in groups of {group}, expected groups of {self.group}"

    def wire_bytes(self, numel: int) -> int:
        """Header, one parameter, ``ceil(numel / 2)`` bytes of codes and 4 bytes per group."""
        return wire_size(SCHEMA, [packed_size(numel, 4), groups_of(numel, self.group)])

    def error_bound(self, payload: CompressedPayload) -> float:
        """Half the largest scale (covers both roundings), plus float32 rounding."""
        scales = payload.arrays["scales"]
        if not scales.size:
            return 0.0
        top = float(np.max(scales))
        return top / 2 + top * 2.0**-23
