"""The options every protocol of the family reads the same way: the inner optimiser and the averaging.

:class:`LowCommOptions` is the base of each protocol's options dataclass (DiLoCo's, Streaming
DiLoCo's, SPARTA's; ``ddp_adamw`` takes exactly these), read from ``algorithm_args`` by
:func:`squall.training.options.read_options`:

==================  ==========================================================================
``inner``           ``adamw`` (default) or ``sgd`` (the run's ``momentum``, ``nesterov``,
                    ``weight_decay``)
``betas``           AdamW's ``[beta1, beta2]`` [0.9, 0.95]
``eps``             AdamW's epsilon [1e-8]
``inner_wd``        AdamW's decoupled weight decay [0.1, DiLoCo's]
``compression``     ``none`` (default), a compressor id (``fp4_e3m0``, ``groupquant`` ...) or
                    ``fp4`` for ``fp4_e3m0``; ``compression_args``: its keyword arguments
``payload``         the run's emulated payload (the train job puts the run's ``payload`` key here)
``timeout``         deadline of each send and receive, s [the transport's]
==================  ==========================================================================

:func:`check_positive_int` and :func:`check_fraction` are the range checks the protocols' own
options share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from squall.lowcomm.average import Averager
from squall.training.compress import COMPRESSORS
from squall.training.compress.base import Compression
from squall.training.optim import AdamW, AdamWConfig, LocalOptimizer, Sgd
from squall.training.payload import Payload
from squall.transport import Transport

INNER: Final = ("adamw", "sgd")
ALIASES: Final = {"fp4": "fp4_e3m0"}
#: AdamW's defaults here: the betas of the papers' reference runs and DiLoCo's weight decay.
BETAS: Final = (0.9, 0.95)
INNER_WD: Final = 0.1


@dataclass(frozen=True)
class LowCommOptions:
    """The family's shared options (see the module docstring); a protocol's options class extends it."""

    inner: Literal["adamw", "sgd"] = "adamw"  # the inner (local) optimiser
    betas: tuple[float, float] = BETAS  # AdamW's beta1, beta2
    eps: float = 1e-8  # AdamW's epsilon
    inner_wd: float = INNER_WD  # AdamW's decoupled weight decay
    compression: str = "none"  # "none", a compressor id, or an alias (ALIASES)
    compression_args: Mapping[str, Any] | None = None  # the compressor's keyword arguments
    payload: Any = None  # the run's emulated payload (Payload.parse input); None: the model's own bytes
    timeout: float | None = None  # per send and receive (None: the transport's default)

    def __post_init__(self) -> None:
        self.compressor()  # checks compression and compression_args
        Payload.parse(self.payload)  # checks the payload

    def inner_optimizer(self, sgd: Sgd) -> LocalOptimizer:
        """The inner (local) optimiser: AdamW from these options, or the run's SGD."""
        if self.inner == "sgd":
            return sgd
        beta1, beta2 = self.betas
        return AdamW(AdamWConfig(beta1=beta1, beta2=beta2, eps=self.eps, weight_decay=self.inner_wd))

    def compressor(self) -> Compression | None:
        """The compressor named by ``compression`` (with ``compression_args``), or None."""
        args = dict(self.compression_args or {})
        if self.compression == "none":
            if args:
                raise ValueError(f"compression_args {sorted(args)} given without a compression")
            return None
        name = ALIASES.get(self.compression, self.compression)
        cls = COMPRESSORS.get(name)
        if cls is None:
            raise ValueError(f"unknown compression {name!r}; allowed: none, {sorted(COMPRESSORS)} or {sorted(ALIASES)}")
        try:
            return cls(**args)
        except TypeError as exc:
            raise ValueError(f"compression {name!r}: bad compression_args {sorted(args)}: {exc}") from exc

    def averager(self, transport: Transport) -> Averager:
        """The averaging seam from ``payload``, ``compression``, ``compression_args`` and ``timeout``."""
        return Averager(transport, payload=Payload.parse(self.payload), compression=self.compressor(),
                        timeout=self.timeout)


def check_positive_int(key: str, value: int) -> None:
    """Refuse ``value`` unless it is an integer >= 1."""
    if value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")


def check_fraction(key: str, value: float, *, low: float = 0.0, high: float = 1.0, open_low: bool = True) -> None:
    """Refuse ``value`` unless it is in ``(low, high]`` (``[low, high]`` when not ``open_low``)."""
    if not (low < value if open_low else low <= value) or value > high:
        raise ValueError(f"{key} must be in {'(' if open_low else '['}{low:g}, {high:g}], got {value}")
