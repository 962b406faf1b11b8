"""The emulated payload: the synchronised state given the byte size of a chosen model.

A paper's speed-up depends on how long its model takes to cross the link; the model that trains
here is small. ``payload: {params: 124M, dtype: bf16}`` in a run's config makes every message of
the synchronised state (gradients, pseudo-gradients, fragments, the selected parameters) as large
as it would be for a model of ``params`` parameters sent in ``dtype``, while the maths runs on the
task's own parameters:

* the real values are sent in ``dtype`` (``fp32``, ``bf16`` or ``fp16``; rounded to it, as a real
  run that communicates in that precision rounds them);
* a message about ``numel`` of the task's ``model`` parameters is padded with zeros to
  :meth:`Payload.padded_numel` ``= ceil(numel x params / model)`` elements, which travel like the
  rest (so the bytes, the chunking and the time on the link are real) and are dropped on receipt.

A protocol that sends a fraction of the model (a fragment, a random subset) sends the same
fraction of the emulated model. Without ``params`` nothing is padded (``dtype`` still applies).
This is the ballast idea (:mod:`~squall.training.tasks.ballast`) moved from the model to the
messages: nothing is allocated for the padding besides the messages themselves, so emulating a
model of 124 M parameters needs no 124 M-parameter optimiser state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

#: Wire dtypes of the synchronised state, by name.
DTYPES: Final = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: Largest emulated model: 10^12 parameters.
MAX_PARAMS: Final = 10**12
_SUFFIX: Final = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_COUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgb]?)\s*$", re.IGNORECASE)


def parse_count(value: object) -> int:
    """A parameter count: an integer, or a string such as ``124M``, ``1.3B``, ``500k``."""
    if isinstance(value, bool):
        raise ValueError(f"payload params must be a count such as 124000000 or '124M', got {value!r}")
    if isinstance(value, int):
        count = value
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    elif isinstance(value, str) and (match := _COUNT.match(value)):
        count = round(float(match.group(1)) * _SUFFIX[match.group(2).lower()])
    else:
        raise ValueError(f"payload params must be a count such as 124000000 or '124M', got {value!r}")
    if not 1 <= count <= MAX_PARAMS:
        raise ValueError(f"payload params must be between 1 and {MAX_PARAMS:.0e}, got {count}")
    return count


@dataclass(frozen=True)
class Payload:
    """The emulated model's size and wire dtype (see the module docstring)."""

    params: int | None = None  # parameters of the emulated model; None: the task's own (no padding)
    dtype: str = "fp32"  # wire dtype of the synchronised state: fp32, bf16 or fp16

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"payload dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.params is not None and not 1 <= self.params <= MAX_PARAMS:
            raise ValueError(f"payload params must be between 1 and {MAX_PARAMS:.0e}, got {self.params}")

    @classmethod
    def parse(cls, obj: Mapping[str, Any] | Payload | None) -> Payload:
        """From ``{"params": "124M", "dtype": "bf16"}`` (both optional); None: fp32, no padding."""
        if obj is None:
            return cls()
        if isinstance(obj, Payload):
            return obj
        if not isinstance(obj, Mapping):
            raise ValueError(f"payload must be a mapping with keys params and dtype, got {obj!r}")
        unknown = sorted(set(obj) - {"params", "dtype"})
        if unknown:
            raise ValueError(f"payload has unknown keys {unknown}; allowed: ['dtype', 'params']")
        params = obj.get("params")
        return cls(params=None if params is None else parse_count(params), dtype=str(obj.get("dtype", "fp32")))

    @property
    def torch_dtype(self) -> torch.dtype:
        """The wire dtype as a torch dtype."""
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        """Bytes per value on the wire."""
        return int(torch.empty((), dtype=self.torch_dtype).element_size())

    @property
    def is_default(self) -> bool:
        """True when nothing is emulated: float32, no padding."""
        return self.params is None and self.dtype == "fp32"

    def check_model(self, model: int) -> None:
        """Raise ValueError when the emulated model is smaller than the task's ``model`` parameters."""
        if self.params is not None and self.params < model:
            raise ValueError(f"payload params {self.params} is smaller than the task's {model} parameters; "
                             "the payload can only make messages larger")

    def padded_numel(self, numel: int, model: int) -> int:
        """Elements on the wire for a message about ``numel`` of ``model`` parameters: ``ceil(numel params/model)``."""
        if numel < 0 or model < 1:
            raise ValueError(f"need numel >= 0 and model >= 1, got {numel} and {model}")
        if self.params is None:
            return numel
        self.check_model(model)
        return max(numel, math.ceil(numel * self.params / model))

    def describe(self, model: int) -> dict[str, Any]:
        """Plain data for results: the emulated size, dtype and bytes of the whole model."""
        params = model if self.params is None else self.params
        return {"params": params, "dtype": self.dtype, "model_params": model, "bytes": params * self.itemsize,
                "scale": params / model}
