"""Claim kinds: how each ``check:`` of ``claims.yaml`` is read and measured.

Every module here exports ``KIND`` (a :class:`~harness.claimkinds.base.ClaimKind`) or ``KINDS`` (a
tuple of them); :data:`KINDS` collects them by name. Adding a kind is adding a module: no table
elsewhere names it. The kinds shipped:

* ``speedup``, ``speedup_grows`` (:mod:`.speedup`): time-to-target ratios between two protocols;
* ``accuracy_gap`` (:mod:`.accuracy`): a protocol's accuracy at equal steps against a reference's;
* ``maths`` (:mod:`.maths`): a statistical or numerical property computed in-process by a function
  the protocol's folder owns (no containers);
* the others are listed by ``squall claims --kinds``.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import MappingProxyType
from typing import Final

from harness.claimkinds.base import (
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
