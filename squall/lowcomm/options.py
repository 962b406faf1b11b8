"""The options every protocol of the family reads the same way: the inner optimiser and the averaging.

A builder (``(transport, sgd, options) -> Algorithm``) pops what it understands from ``options``;
these helpers pop the shared keys:

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
"""

from __future__ import annotations

from typing import Any, Final

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


def inner_optimizer(sgd: Sgd, options: dict[str, Any]) -> LocalOptimizer:
    """The inner (local) optimiser: AdamW from the options, or the run's SGD."""
    kind = str(options.pop("inner", "adamw"))
    betas = options.pop("betas", BETAS)
    eps = float(options.pop("eps", 1e-8))
    wd = float(options.pop("inner_wd", INNER_WD))
    if kind not in INNER:
        raise ValueError(f"inner must be one of {INNER}, got {kind!r}")
    if kind == "sgd":
        return sgd
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        raise ValueError(f"betas must be two numbers [beta1, beta2], got {betas!r}")
    return AdamW(AdamWConfig(beta1=float(betas[0]), beta2=float(betas[1]), eps=eps, weight_decay=wd))


def compressor(options: dict[str, Any], *, default: str = "none") -> Compression | None:
    """The compressor named by ``compression`` (with ``compression_args``), or None."""
    name = str(options.pop("compression", default))
    args = options.pop("compression_args", {}) or {}
    if name == "none":
        if args:
            raise ValueError(f"compression_args {sorted(args)} given without a compression")
        return None
    name = ALIASES.get(name, name)
    cls = COMPRESSORS.get(name)
    if cls is None:
        raise ValueError(f"unknown compression {name!r}; allowed: none, {sorted(COMPRESSORS)} or {sorted(ALIASES)}")
    if not isinstance(args, dict):
        raise ValueError(f"compression_args must be a mapping, got {args!r}")
    try:
        return cls(**args)
    except TypeError as exc:
        raise ValueError(f"compression {name!r}: bad compression_args {sorted(args)}: {exc}") from exc


def averager(transport: Transport, options: dict[str, Any], *, compression: str = "none") -> Averager:
    """The averaging seam from ``payload``, ``compression``, ``compression_args`` and ``timeout``."""
    timeout = options.pop("timeout", None)
    return Averager(transport, payload=Payload.parse(options.pop("payload", None)),
                    compression=compressor(options, default=compression),
                    timeout=None if timeout is None else float(timeout))


def positive_int(options: dict[str, Any], key: str, default: int) -> int:
    """``options[key]`` as an integer >= 1 (popped)."""
    value = options.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return value


def fraction(options: dict[str, Any], key: str, default: float, *, low: float = 0.0, high: float = 1.0,
             open_low: bool = True) -> float:
    """``options[key]`` as a float in ``(low, high]`` (``[low, high]`` when not ``open_low``), popped."""
    value = options.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    number = float(value)
    if not (low < number if open_low else low <= number) or number > high:
        raise ValueError(f"{key} must be in {'(' if open_low else '['}{low:g}, {high:g}], got {number}")
    return number
