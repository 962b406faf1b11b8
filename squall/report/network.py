"""The report's first question: what network did the runs see?

Per profile its description, the file it came from and a table of its links (directed links with
the same settings share a row), as plain data. :func:`describe_profiles` reads the profiles when
the results are made, so a report rebuilt elsewhere (``squall report``) still shows them;
:func:`profile_sections` falls back to loading a profile it was not given. The second question,
was its emulation faithful, is answered by :mod:`squall.checks.fidelity`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from squall.profiles import LinkSpec, Profile, ProfileError, load_profile
from squall.profiles.units import format_duration_us, format_probability, format_rate_bps

logger = logging.getLogger(__name__)

LINK_HEAD = ["links", "delay", "jitter", "loss", "duplicate", "reorder", "rate", "queue"]


# -- what network ----------------------------------------------------------------------------------
def _chance(probability: float, correlation: float) -> str:
    if not probability:
        return "-"
    return format_probability(probability) + (f" (correlation {format_probability(correlation)})"
                                              if correlation else "")


def link_cells(spec: LinkSpec) -> list[str]:
    """One link's settings in words, in :data:`LINK_HEAD` order (without the first column)."""
    jitter = "-"
    if spec.jitter.amount_us:
        jitter = f"{format_duration_us(spec.jitter.amount_us)} {spec.jitter.distribution.value}"
        if spec.jitter.correlation:
            jitter += f" (correlation {format_probability(spec.jitter.correlation)})"
    loss = _chance(spec.loss.probability, spec.loss.correlation)
    if spec.loss.gemodel:
        loss = f"bursty, mean {format_probability(round(spec.loss.gemodel.mean_loss, 5))}"
    return [format_duration_us(spec.delay_us) if spec.delay_us else "0", jitter, loss,
            _chance(spec.duplicate.probability, spec.duplicate.correlation),
            _chance(spec.reorder.probability, spec.reorder.correlation),
            format_rate_bps(spec.rate_bps) if spec.rate_bps else "unlimited",
            str(spec.limit_packets) if spec.limit_packets else "auto"]


def _which(links: Sequence[tuple[int, int]], total: int) -> str:
    if len(links) == total:
        return f"all {total}"
    return ", ".join(f"{a}->{b}" for a, b in links)


def link_rows(profile: Profile, workers: int, at: float = 0.0) -> list[list[str]]:
    """Rows of the link table at ``at`` seconds: directed links with the same settings grouped."""
    links = profile.links(workers, at)
    groups: dict[tuple[str, ...], list[tuple[int, int]]] = {}
    for link, spec in links.items():
        groups.setdefault(tuple(link_cells(spec)), []).append(link)
    return [[_which(members, len(links)), *cells] for cells, members in groups.items()]


def describe_profile(profile: Profile, workers: int) -> dict[str, Any]:
    """Plain data for one profile as the runs saw it on ``workers`` nodes."""
    phases = [{"at_s": phase.at_s, "name": phase.name, "links": link_rows(profile, workers, phase.at_s)}
              for phase in profile.phases]
    churn = len(profile.churn_events(workers, 600.0))
    return {"name": profile.name, "description": profile.description, "source": profile.source,
            "workers": workers, "links": link_rows(profile, workers), "phases": phases, "churn_events_600s": churn}


def describe_profiles(names_workers: Iterable[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """Plain data for every (profile name or path, cluster size) used, keyed by the profile's own name
    (what ``RunTrace.profile`` holds), for ``Results.meta["profiles"]``.

    A profile that cannot be loaded gets an entry that says why, instead of raising."""
    out: dict[str, dict[str, Any]] = {}
    for name, workers in sorted(set(names_workers)):
        if name in out:
            continue
        try:
            profile = load_profile(name)
            out.setdefault(profile.name, describe_profile(profile, workers))
        except (ProfileError, OSError, ValueError) as exc:
            logger.warning("profile %s: %s", name, exc)
            out[name] = {"name": name, "description": f"not found when the report was made: {exc}",
                         "source": "-", "workers": workers, "links": [], "phases": []}
    return out


def profile_sections(cells: Sequence[tuple[str, int]], given: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One description per profile of ``cells`` ((profile, workers) pairs): ``given`` first, else loaded."""
    known = {k: v for k, v in given.items() if isinstance(v, Mapping)}
    missing = [(p, w) for p, w in cells if p not in known]
    loaded = describe_profiles(missing) if missing else {}
    return [dict(known.get(name) or loaded[name]) for name in sorted({p for p, _ in cells})]
