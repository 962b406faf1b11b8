"""Claim kinds: how each ``check:`` of ``claims.yaml`` is read and measured.

Every module here exports ``KIND`` (a :class:`~squall.claims.kinds.base.ClaimKind`) or ``KINDS`` (a
tuple of them); :data:`KINDS` collects them by name. Adding a kind is adding a module: no table
elsewhere names it. ``squall claims`` shows each claim's kind; the kinds shipped:

* ``speedup``, ``speedup_grows`` (:mod:`.speedup`): time-to-target ratios between two protocols;
* ``straggler_robustness``, ``straggler_overhead``, ``threshold_choice`` (:mod:`.stragglers`) and
  ``loss_per_sample`` (:mod:`.samples`): DropCompute's and Non-blocking SGD's claims;
* ``drift_bounded``, ``loss_accuracy`` (:mod:`.drift`) and ``unbiased`` (:mod:`.unbiased`): training
  under packet loss;
* ``sketch_contraction``, ``heterogeneous_synthetic``, ``quantized_error``, ``quantized_inference``
  (:mod:`.compression`): compressed communication.

Pure-maths kinds call a function the protocol's folder owns, named in ``params`` as
``package.module:function`` (:func:`squall.job.resolve_callable`), so the claim tests the code the
workers run and the harness imports no protocol folder.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import MappingProxyType
from typing import Final

from squall.claims.kinds.base import (
    COMMON,
    RUN_FIELDS,
    STANDARD,
    Claim,
    ClaimError,
    ClaimKind,
    Runner,
    interleaved,
)

_INTERNAL = {"base"}


def _discover() -> dict[str, ClaimKind]:
    found: dict[str, ClaimKind] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in _INTERNAL or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        kinds = getattr(module, "KINDS", None) or ((module.KIND,) if hasattr(module, "KIND") else ())
        for kind in kinds:
            if kind.name in found:
                raise ImportError(f"claim kind {kind.name!r} is declared twice (second in {module.__name__})")
            found[kind.name] = kind
    return found


#: Every claim kind, by its ``check:`` name.
KINDS: Final[MappingProxyType[str, ClaimKind]] = MappingProxyType(_discover())

__all__ = ["COMMON", "KINDS", "RUN_FIELDS", "STANDARD", "Claim", "ClaimError", "ClaimKind", "Runner", "interleaved"]
