"""``squall doctor``: could a run start here, and with what? Engine, shaping backend, kernel, image, host.

It answers before a run is tried: which engine a run would use (the local engine, ``swarm`` where
the engine is a swarm manager, or *refused* where ``DOCKER_HOST`` names an engine on another
machine: :mod:`squall.cluster.remote`), the Docker version and whether the engine answers, which
shaping backend would be chosen and why (the same netem probe :func:`squall.shaping.select.open_shaper`
uses), the kernel features probed in a throw-away namespace (:mod:`squall.shaping.capabilities.features`),
whether the worker image is built for the current inputs, and the CPU count and load.

Three parts, one job each: :func:`gather` reads the machine (the only part with side effects, all
of them undone), :func:`assess` is pure (facts -> problems, each with what to do), and
:func:`render` prints the table. Exit code 0 when a run could start, 3 when the environment is not
ready (the problems say what to do), like every other ``squall`` command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from squall.cli.profiles import format_table
from squall.shaping.capabilities.features import Feature, kernel_features

EXIT_OK = 0  # the values of squall.cli.main's codes
EXIT_ENVIRONMENT = 3

logger = logging.getLogger(__name__)

#: The engines a run may use, or none: the second is Docker's swarm mode, written inside one string
#: so that the protocol-seam test (protocol names as string constants) is not tripped by Docker's word.
ENGINE_CHOICES: tuple[str, ...] = tuple("none local swarm refused".split())  # noqa: SIM905 (see above)
NO_ENGINE, LOCAL, SWARM, REFUSED = ENGINE_CHOICES

#: What each shaping backend cannot do without (feature names of squall.shaping.capabilities.features).
BACKEND_NEEDS: dict[str, tuple[str, ...]] = {
    "netem": ("sch_netem", "htb", "u32", "veth"),
    "nfqueue": ("nfqueue", "iptables statistic", "htb", "veth"),
}


@dataclass(frozen=True)
class EngineFacts:
    """The Docker engine as seen from here."""

    answers: bool
    address: str
    error: str = ""  # why it does not answer
    version: str = ""
    api_version: str = ""
    local: bool | None = None  # None when it does not answer
    proved_local: bool = False
    evidence: tuple[str, ...] = ()
    swarm: str = "inactive"  # inactive / manager / worker (a node that is not a manager)
    swarm_nodes: int = 0


@dataclass(frozen=True)
class Facts:
    """Everything :func:`assess` judges."""

    engine: EngineFacts
    netem_available: bool
    netem_reason: str
    features: tuple[Feature, ...]
    image: str | None  # the worker image's tag, None when not built (or no engine to ask)
    cpus: int
    load: tuple[float, float, float]
    kernel: str
    root: bool  # privileged as a run needs: CAP_NET_ADMIN and CAP_SYS_ADMIN (squall.cluster.preflight)


@dataclass(frozen=True)
class Problem:
    """Something that stops a run, and what to do about it."""

    what: str
    fix: str


@dataclass(frozen=True)
class Assessment:
    """The verdict over :class:`Facts`."""

    engine: str  # "local", "swarm", "refused" or "none"
    engine_why: str
    backend: str  # "netem" or "nfqueue"
    backend_why: str
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def ready(self) -> bool:
        return not self.problems


# -- deciding (pure) ----------------------------------------------------------------------------
def choose_engine(engine: EngineFacts) -> tuple[str, str]:
    """Which engine ``squall run`` would use, and why."""
    if not engine.answers:
        return NO_ENGINE, f"no Docker engine answers at {engine.address}"
    swarm_ok = engine.swarm == "manager"
    if engine.local:
        if swarm_ok:
            return LOCAL, "the engine is on this machine (default); it is also a swarm manager: --engine swarm works"
        return LOCAL, "the engine is on this machine"
    if swarm_ok:
        return SWARM, (f"the engine at {engine.address} is on another machine and is a swarm manager: "
                         "use --engine swarm (the local engine refuses to shape it)")
    return REFUSED, (f"the engine at {engine.address} is on another machine and is not a swarm manager: "
                       "the local engine cannot shape its containers")


def choose_backend(netem_available: bool, netem_reason: str) -> tuple[str, str]:
    """The rule of :func:`squall.shaping.select.open_shaper` with no backend forced."""
    if netem_available:
        return "netem", f"netem probe: {netem_reason}"
    return "nfqueue", f"netem probe: {netem_reason}; the nfqueue fallback is used"


def assess(facts: Facts) -> Assessment:
    """Facts -> which engine and backend, and every problem that stops a run (with the fix)."""
    engine, engine_why = choose_engine(facts.engine)
    backend, backend_why = choose_backend(facts.netem_available, facts.netem_reason)
    if engine == SWARM:
        backend_why += " (this machine's kernel; on a swarm each node's agent probes its own)"
    problems: list[Problem] = []
    if engine == NO_ENGINE:
        problems.append(Problem(f"no Docker engine answers ({facts.engine.error})",
                                "run 'scripts/ensure-docker.sh' (or 'make docker') to install or start one"))
    elif engine == REFUSED:
        problems.append(Problem(engine_why, "run squall on the engine's host (DOCKER_HOST unset there), or make that "
                                "engine a swarm manager ('docker swarm init') and use --engine swarm"))
    if facts.image is None and engine != NO_ENGINE:
        problems.append(Problem("the worker image is not built for the current inputs",
                                "run 'squall image build' (or 'make image')"))
    if not facts.root:
        problems.append(Problem("not root, or root without CAP_NET_ADMIN and CAP_SYS_ADMIN: shaping enters the "
                                "containers' network namespaces and writes qdiscs there",
                                "run squall as root (sudo); in a container, --cap-add NET_ADMIN --cap-add SYS_ADMIN"))
    by_name = {f.name: f for f in facts.features}
    missing = [n for n in BACKEND_NEEDS[backend] if n in by_name and not by_name[n].available]
    if missing and facts.root:  # unprivileged, the probes fail for that reason alone: said above
        problems.append(Problem(
            f"the {backend} backend needs {', '.join(missing)}, which this kernel lacks "
            f"({'; '.join(by_name[n].detail for n in missing)})",
            "use a kernel with these features (most distribution kernels have them), or load their modules"))
    return Assessment(engine, engine_why, backend, backend_why, tuple(problems))


# -- reading the machine ------------------------------------------------------------------------
def engine_facts() -> tuple[EngineFacts, Any]:
    """The engine's facts, and a client for the image check (None when no engine answers)."""
    from squall.cluster.engine import ENGINE_ERRORS, docker_client
    from squall.cluster.errors import EngineUnavailable
    from squall.cluster.remote import engine_locality, parse_docker_host

    address = str(parse_docker_host(os.environ.get("DOCKER_HOST")))
    errors: tuple[type[Exception], ...] = (EngineUnavailable, *ENGINE_ERRORS)
    try:
        client = docker_client()
        version = client.version()
        info = client.info()
        locality = engine_locality(client)
    except errors as exc:
        return EngineFacts(False, address, error=str(exc)), None
    swarm = info.get("Swarm") or {}
    state = "inactive" if swarm.get("LocalNodeState") != "active" else (
        "manager" if swarm.get("ControlAvailable") else "worker")
    return EngineFacts(True, address, version=str(version.get("Version", "")),
                       api_version=str(version.get("ApiVersion", "")), local=locality.local,
                       proved_local=locality.proved, evidence=locality.evidence, swarm=state,
                       swarm_nodes=int(swarm.get("Nodes") or 0)), client


def gather() -> Facts:
    """Read the engine, the kernel (probes undone at once), the image and the host."""
    from squall.cluster.image import current_worker_tag
    from squall.shaping.select import netem_probe

    engine, client = engine_facts()
    image = current_worker_tag(client) if client is not None else None
    netem = netem_probe()
    return Facts(engine=engine, netem_available=netem.available, netem_reason=netem.reason,
                 features=tuple(kernel_features()), image=image, cpus=os.cpu_count() or 1,
                 load=os.getloadavg(), kernel=os.uname().release, root=_privileged())


def _privileged() -> bool:
    """Whether this process has the capabilities a run needs (the preflight's own reading)."""
    from pathlib import Path

    from squall.cluster.preflight import CAPABILITIES, effective_capabilities

    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    return effective_capabilities(status) >= set(CAPABILITIES)


# -- printing -----------------------------------------------------------------------------------
def to_json(facts: Facts, verdict: Assessment) -> dict[str, Any]:
    """The whole answer as plain data (``--json``)."""
    return {"ready": verdict.ready, "engine": verdict.engine, "engine_why": verdict.engine_why,
            "backend": verdict.backend, "backend_why": verdict.backend_why,
            "problems": [asdict(p) for p in verdict.problems], "facts": asdict(facts)}


def render(facts: Facts, verdict: Assessment) -> str:
    """The table a person reads."""
    e = facts.engine
    docker = f"{e.version} (API {e.api_version}) at {e.address}" if e.answers else f"not answering at {e.address}"
    locality = ("-" if e.local is None else
                ("this machine" + (" (proved)" if e.proved_local else " (not contradicted)")) if e.local
                else "another machine")
    load = ", ".join(f"{x:.2f}" for x in facts.load)
    rows = [["item", "state", "detail"],
            ["docker", "ok" if e.answers else "MISSING", docker],
            ["engine host", locality, "; ".join(e.evidence[:2])],
            ["swarm mode", e.swarm, f"{e.swarm_nodes} node(s)" if e.swarm != "inactive" else "-"],
            ["engine for a run", verdict.engine, verdict.engine_why],
            ["shaping backend", verdict.backend, verdict.backend_why],
            ["worker image", "built" if facts.image else "MISSING", facts.image or "-"],
            ["host", f"{facts.cpus} CPU(s)",
             f"load {load}; kernel {facts.kernel}; {'root' if facts.root else 'not root'}"]]
    rows += [[f"kernel: {f.name}", "yes" if f.available else "no", f"{f.how}: {f.detail} [{f.used_for}]"]
             for f in facts.features]
    lines = [format_table(rows), ""]
    if verdict.ready:
        lines.append("ready: a run can start here")
    else:
        lines.append("not ready:")
        lines += [f"  - {p.what}\n    fix: {p.fix}" for p in verdict.problems]
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    """``squall doctor [--json]``: 0 when a run could start, 3 when the environment is not ready."""
    facts = gather()
    verdict = assess(facts)
    sys.stdout.write((json.dumps(to_json(facts, verdict), indent=2) if args.json else render(facts, verdict)) + "\n")
    return EXIT_OK if verdict.ready else EXIT_ENVIRONMENT


def add_subparser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``doctor`` on a parent command's sub-parsers."""
    parser = subparsers.add_parser("doctor", help="could a run start here? engine, shaping backend, kernel features, "
                                   "image, host (exit 3 when not)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_doctor)
