"""``squall gc``: remove what runs that are gone left behind (containers, networks, state files)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.errors import DockerException, NotFound

from harness.cluster.ownership import LABEL_RUN, LABEL_STATE, Owner, read_owner, state_root

logger = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What a collection found and removed."""

    runs: dict[str, bool] = field(default_factory=dict)  # run id -> owner alive
    removed_containers: list[str] = field(default_factory=list)  # names
    removed_networks: list[str] = field(default_factory=list)  # names
    removed_dirs: list[str] = field(default_factory=list)  # state directories
    errors: list[str] = field(default_factory=list)  # what could not be removed, with why


def collect(client: Any, *, everything: bool = False, dry_run: bool = False) -> GcReport:
    """Remove objects labelled ``squall.run`` whose owner process is gone (all of them with ``everything``)."""
    report = GcReport()
    containers = client.containers.list(all=True, filters={"label": LABEL_RUN})
    networks = client.networks.list(filters={"label": LABEL_RUN})
    dead: set[str] = set()
    state_dirs: dict[str, str] = {}
    for obj in [*containers, *networks]:
        labels = obj.attrs.get("Config", {}).get("Labels") or obj.attrs.get("Labels") or {}
        run = labels.get(LABEL_RUN, "")
        owner = Owner.from_labels(labels)
        alive = owner is not None and owner.alive()
        report.runs[run] = report.runs.get(run, False) or alive
        if LABEL_STATE in labels:
            state_dirs[run] = labels[LABEL_STATE]
    dead = {run for run, alive in report.runs.items() if everything or not alive}
    for c in containers:
        if (c.labels or {}).get(LABEL_RUN) in dead:
            _remove(report, "container", c.name, dry_run, lambda c=c: c.remove(force=True, v=True))
            report.removed_containers.append(c.name)
    for n in networks:
        if (n.attrs.get("Labels") or {}).get(LABEL_RUN) in dead:
            _remove(report, "network", n.name, dry_run, n.remove)
            report.removed_networks.append(n.name)
    for run in sorted(dead):
        path = Path(state_dirs.get(run, state_root() / run))
        if path.exists() and path.name == run:
            if not dry_run:
                shutil.rmtree(path, ignore_errors=True)
            report.removed_dirs.append(str(path))
    _orphan_dirs(report, dead_or_unknown=everything, dry_run=dry_run, known=set(report.runs))
    return report


def _orphan_dirs(report: GcReport, *, dead_or_unknown: bool, dry_run: bool, known: set[str]) -> None:
    """State directories with no container or network left whose owner is gone (it died in teardown)."""
    root = state_root()
    if not root.is_dir():
        return
    for path in root.iterdir():
        if not path.is_dir() or path.name in known or str(path) in report.removed_dirs:
            continue
        owner = read_owner(path)
        if owner is None and not dead_or_unknown:
            continue  # not a run directory we can judge
        if owner is not None and owner.alive() and not dead_or_unknown:
            continue  # a run still being created or torn down
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
        report.removed_dirs.append(str(path))


def _remove(report: GcReport, kind: str, name: str, dry_run: bool, action: Any) -> None:
    if dry_run:
        return
    try:
        with contextlib.suppress(NotFound):
            action()
    except DockerException as exc:
        report.errors.append(f"{kind} {name}: {exc}")
