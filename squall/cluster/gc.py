"""``squall gc``: remove what runs that are gone left behind.

That is: containers, networks and (swarm engine) services and secrets labelled ``squall.run``
(with them go Docker's host iptables rules and bridge of the network), the manager's entries of
emulated swarm nodes (:mod:`squall.cluster.swarm.dind`; their containers are among the above),
the run's state directory, and what its shaper keeps on the host (the nfqueue delay daemon and its work directory,
:func:`squall.shaping.select.host_leftovers`). The daemons are stopped first: their sockets would keep the
dead containers' network namespaces alive. A swarm Squall initialised is left once no live run
uses it (:mod:`squall.cluster.swarm.membership`). Everything is judged by run id and owner (pid
+ start time), so a live run is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

from squall.cluster.engine import ENGINE_ERRORS
from squall.cluster.errors import ClusterError
from squall.cluster.ownership import LABEL_RUN, LABEL_STATE, Owner, read_owner, state_root
from squall.shaping.base import HostLeftover

logger = logging.getLogger(__name__)

#: A shaper work directory with no owner recorded is judged only after this many seconds: it may
#: have been created a moment ago, before its owner record was written.
UNRECORDED_GRACE_S = 60.0


@dataclass
class GcReport:
    """What a collection found and removed."""

    runs: dict[str, bool] = field(default_factory=dict)  # run id -> owner alive
    removed_containers: list[str] = field(default_factory=list)  # names
    removed_networks: list[str] = field(default_factory=list)  # names
    removed_dirs: list[str] = field(default_factory=list)  # state directories
    stopped_daemons: list[int] = field(default_factory=list)  # pids of nfqueue delay daemons
    removed_workdirs: list[str] = field(default_factory=list)  # nfqueue work directories
    removed_services: list[str] = field(default_factory=list)  # swarm services (workers, node agents)
    removed_secrets: list[str] = field(default_factory=list)  # swarm secrets (the agents' tokens)
    removed_swarm_nodes: list[str] = field(default_factory=list)  # manager entries of emulated (DinD) nodes
    left_swarm: bool = False  # the swarm Squall had initialised was left (no live run used it)
    errors: list[str] = field(default_factory=list)  # what could not be removed, with why


def collect(client: Any, *, everything: bool = False, dry_run: bool = False) -> GcReport:
    """Remove objects labelled ``squall.run`` whose owner process is gone (all of them with ``everything``)."""
    report = GcReport()
    containers = client.containers.list(all=True, filters={"label": LABEL_RUN})
    networks = client.networks.list(filters={"label": LABEL_RUN})
    services = _swarm_objects(client.services)
    secrets = _swarm_objects(client.secrets)
    dead: set[str] = set()
    state_dirs: dict[str, str] = {}
    for obj in [*containers, *networks, *services, *secrets]:
        labels = _labels(obj)
        run = labels.get(LABEL_RUN, "")
        owner = Owner.from_labels(labels)
        alive = owner is not None and owner.alive()
        report.runs[run] = report.runs.get(run, False) or alive
        if LABEL_STATE in labels:
            state_dirs[run] = labels[LABEL_STATE]
    dead = {run for run, alive in report.runs.items() if everything or not alive}
    live = {run for run, alive in report.runs.items() if alive}
    _shaper_leftovers(report, dead=dead, live=live, everything=everything, dry_run=dry_run)
    for svc in services:  # first: Swarm would otherwise start new tasks for the containers removed below
        if _labels(svc).get(LABEL_RUN) in dead:
            _remove(report, "service", svc.name, dry_run, svc.remove)
            report.removed_services.append(svc.name)
    for c in containers:
        if (c.labels or {}).get(LABEL_RUN) in dead:
            _remove(report, "container", c.name, dry_run, lambda c=c: c.remove(force=True, v=True))
            report.removed_containers.append(c.name)
    for n in networks:
        if (n.attrs.get("Labels") or {}).get(LABEL_RUN) in dead:
            if n.attrs.get("Driver") == "overlay":  # Swarm deletes it once the removed tasks are gone
                _remove(report, "network", n.name, dry_run, lambda n=n: _remove_overlay(client, n), retry_s=30.0)
            else:
                _remove(report, "network", n.name, dry_run, n.remove)
            report.removed_networks.append(n.name)
    for sec in secrets:
        if _labels(sec).get(LABEL_RUN) in dead:
            _remove(report, "secret", sec.name, dry_run, sec.remove)
            report.removed_secrets.append(sec.name)
    _swarm_node_entries(client, report, live=live, dry_run=dry_run)
    if not dry_run:
        _leave_swarm(client, report, everything=everything)
    for run in sorted(dead):
        path = Path(state_dirs.get(run, state_root() / run))
        if path.exists() and path.name == run:
            if not dry_run:
                shutil.rmtree(path, ignore_errors=True)
            report.removed_dirs.append(str(path))
    _orphan_dirs(report, dead_or_unknown=everything, dry_run=dry_run, known=set(report.runs))
    return report


def leftover_is_stale(run_id: str, *, dead: set[str], live: set[str], owner_alive: bool | None,
                      everything: bool) -> bool:
    """Whether a shaper's host-side leftover of run ``run_id`` goes.

    It goes with its run when the run's containers say it is dead (or with ``everything``); a run
    they say is alive keeps it; a run Docker no longer knows is judged by the owner recorded in
    the work directory (``owner_alive``; None: nothing recorded, treated as dead).
    """
    if everything or run_id in dead:
        return True
    if run_id in live:
        return False
    return not owner_alive


def _owner_alive(leftover: HostLeftover) -> bool | None:
    if leftover.owner_pid is not None and leftover.owner_start is not None:
        return Owner(socket.gethostname(), leftover.owner_pid, leftover.owner_start).alive()
    try:
        age = time.time() - leftover.workdir.stat().st_mtime
    except OSError:
        return None  # a daemon whose work directory is gone: nothing left to own it
    return True if age < UNRECORDED_GRACE_S else None


def _shaper_leftovers(report: GcReport, *, dead: set[str], live: set[str], everything: bool,
                      dry_run: bool) -> None:
    """Stop the shapers' helpers (the nfqueue delay daemons) of dead runs and delete their work directories."""
    from squall.shaping.select import host_leftovers  # the backends: pyroute2, only when collecting

    for leftover in host_leftovers():
        if not leftover_is_stale(leftover.run_id, dead=dead, live=live, owner_alive=_owner_alive(leftover),
                                 everything=everything):
            continue
        if not dry_run:
            report.errors += leftover.remove()
        report.stopped_daemons += leftover.daemons
        report.removed_workdirs.append(str(leftover.workdir))
        logger.info("run %s: stopped %d %s daemon(s), removed %s", leftover.run_id, len(leftover.daemons),
                    leftover.backend, leftover.workdir)


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


def _remove(report: GcReport, kind: str, name: str, dry_run: bool, action: Any, *, retry_s: float = 0.0) -> None:
    if dry_run:
        return
    deadline = time.monotonic() + retry_s
    while True:
        try:
            with contextlib.suppress(NotFound):
                action()
            return
        except ENGINE_ERRORS as exc:
            if time.monotonic() >= deadline:
                report.errors.append(f"{kind} {name}: {exc}")
                return
        time.sleep(0.5)


def _remove_overlay(client: Any, net: Any) -> None:
    """Ask for the overlay's removal; raise (so :func:`_remove` asks again) while it is still listed."""
    net.remove()
    client.networks.get(net.id)  # NotFound: gone
    raise APIError(f"overlay network {net.name} is still there")


def _labels(obj: Any) -> dict[str, str]:
    """A container's, network's, service's or secret's labels."""
    attrs = obj.attrs
    return attrs.get("Config", {}).get("Labels") or attrs.get("Labels") or attrs.get("Spec", {}).get("Labels") or {}


def _swarm_objects(collection: Any) -> list[Any]:
    """Services or secrets labelled ``squall.run``; none when this engine manages no swarm."""
    try:
        return list(collection.list(filters={"label": LABEL_RUN}))
    except ENGINE_ERRORS:  # "This node is not a swarm manager": nothing of the kind can exist here
        return []


def _swarm_node_entries(client: Any, report: GcReport, *, live: set[str], dry_run: bool) -> None:
    """The manager's entries of emulated swarm nodes (:mod:`squall.cluster.swarm.dind`) of runs not alive.

    Their containers went above, with the other containers of dead runs; a run whose containers
    are already gone is judged dead here too (an entry outlives its node only when a run died).
    """
    from squall.cluster.swarm import dind

    try:
        runs = dind.node_runs(client)
    except ENGINE_ERRORS as exc:
        report.errors.append(f"listing the swarm's nodes: {exc}")
        return
    for node_id, run in runs.items():
        if run in live:
            continue
        report.removed_swarm_nodes.append(node_id)
    if dry_run:
        return
    for run in sorted({r for r in runs.values() if r not in live}):
        report.errors += dind.remove_swarm_entries(client, run)


def _leave_swarm(client: Any, report: GcReport, *, everything: bool) -> None:
    """Leave the swarm Squall initialised when no live run uses it any more (a swarm found is kept)."""
    from squall.cluster.swarm import membership

    try:
        report.left_swarm = membership.release(client, None, force=everything)
    except ClusterError as exc:
        report.errors.append(str(exc))
