"""The claims registry: each seed paper's claim as data (``claims.yaml``), and how to evaluate one.

A claim's ``check:`` names its kind (:mod:`squall.claims.kinds`): the kind says which standard keys
the claim must carry, which of its own keys go under ``params``, and how it is measured. Speed-up
kinds run the protocols interleaved (a, b, a, b, ... over seeds) on one lab per cluster size, so slow
drifts of a shared machine hit both sides alike, and compare medians; pure-maths kinds run in-process.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from squall.assets import AssetError, claims_file
from squall.checks import Target, crashed
from squall.claims.kinds import COMMON, KINDS, RUN_FIELDS, STANDARD, Claim, ClaimError, ClaimKind, Runner
from squall.report.page import ClaimResult

logger = logging.getLogger(__name__)

CLAIMS_FILE = claims_file()  # package data of an installed Squall, the checkout's claims.yaml otherwise
#: The common keys a claim may omit.
OPTIONAL = frozenset({"gate"})

__all__ = ["CLAIMS_FILE", "Claim", "ClaimError", "Runner", "evaluate", "load_claims"]


def _kind(raw: Mapping[str, Any], name: str) -> ClaimKind:
    kind = KINDS.get(str(raw.get("check")))
    if kind is None:
        raise ClaimError(f"{name}: check {raw.get('check')!r} is not one of {sorted(KINDS)}")
    return kind


def _keys(raw: Mapping[str, Any], kind: ClaimKind, name: str) -> None:
    required = COMMON - OPTIONAL | kind.requires | ({"params"} if kind.required_params else set())
    allowed = required | COMMON | kind.accepts | ({"params"} if kind.params else set())
    unknown, missing = sorted(set(raw) - allowed), sorted(required - set(raw))
    if unknown or missing:
        raise ClaimError(f"{name}: unknown keys {unknown}, missing keys {missing}; a {kind.name!r} claim takes "
                         f"{sorted(allowed)} (required: {sorted(required)})")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise ClaimError(f"{name}: params must be a mapping, got {params!r}")
    bad, absent = sorted(set(params) - kind.params), sorted(kind.required_params - set(params))
    if bad or absent:
        raise ClaimError(f"{name}: params has unknown keys {bad}, missing keys {absent}; "
                         f"a {kind.name!r} claim's params: {sorted(kind.params)}")
    run = raw.get("run") or {}
    if not isinstance(run, dict) or set(run) - RUN_FIELDS:
        extra = sorted(set(run) - RUN_FIELDS) if isinstance(run, dict) else run
        raise ClaimError(f"{name}: run has unknown keys {extra}; allowed: {sorted(RUN_FIELDS)}")


def _optional_float(raw: Mapping[str, Any], key: str) -> float | None:
    return None if raw.get(key) is None else float(raw[key])


def _claim(raw: Any, where: str) -> Claim:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where}: a claim must be a mapping with keys {sorted(COMMON | STANDARD)}")
    name = f"{where} ({raw.get('id', '?')})"
    kind = _kind(raw, name)
    _keys(raw, kind, name)
    target = raw.get("target")
    try:
        claim = Claim(
            id=str(raw["id"]), paper=str(raw["paper"]), claim=str(raw["claim"]),
            paper_figure=str(raw["paper_figure"]), our_setting=str(raw["our_setting"]), check=kind.name,
            fast=str(raw.get("fast") or ""), slow=str(raw.get("slow") or ""),
            protocols=tuple(str(p) for p in raw.get("protocols") or ()),
            profiles=tuple(str(p) for p in raw.get("profiles") or ()), workers=int(raw.get("workers") or 0),
            seeds=tuple(int(s) for s in raw.get("seeds") or ()),
            target=Target.of(target),
            at_least=_optional_float(raw, "at_least"), at_most=_optional_float(raw, "at_most"),
            run=dict(raw.get("run") or {}), params=dict(raw.get("params") or {}), gate=bool(raw.get("gate", True)))
        if "workers" in raw and claim.workers < 1:
            raise ValueError(f"workers must be >= 1, got {raw['workers']!r}")
        if "seeds" in raw and not claim.seeds:
            raise ValueError("seeds must list at least one seed")
        if kind.validate is not None:
            kind.validate(claim)
    except (KeyError, TypeError, ValueError) as exc:
        raise ClaimError(f"{name}: {exc}") from exc
    return claim


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """Every claim in the registry file, validated; ids are unique.

    :raises AssetError: the shipped registry is missing (a broken install: environment, exit 3).
    :raises ClaimError: a registry file named by the caller is missing or malformed (bad input).
    """
    if not path.is_file():
        if path == CLAIMS_FILE:
            raise AssetError(f"{path}: the shipped claims registry is missing: reinstall Squall")
        raise ClaimError(f"{path}: no such claims file")
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list):
        raise ClaimError(f"{path}: the registry must be a list of claims")
    claims = [_claim(item, f"{path}[{k}]") for k, item in enumerate(raw)]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ClaimError(f"{path}: duplicated claim ids in {ids}")
    return claims


def evaluate(claim: Claim, run: Runner) -> ClaimResult:
    """Measure ``claim`` with its kind and return it next to the paper's figure.

    A kind that crashes gives an ``unknown`` verdict naming the exception (never a pass).
    """
    kind = KINDS[claim.check]
    try:
        verdict = kind.evaluate(claim, run)
    except Exception as exc:
        logger.exception("claim %s crashed", claim.id)
        verdict = crashed(claim.check, exc, what="claim")
    return ClaimResult(claim.id, claim.paper, claim.claim, claim.paper_figure, claim.our_setting, verdict)
