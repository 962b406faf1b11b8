"""Names of the entry points a job may ask for: a name maps to ``"package.module:function"``.

:data:`REGISTRY` holds the utility jobs that belong to no protocol (diagnostics, probes, the
shared ``train`` job, the collectives' benchmark). A protocol's own jobs are declared by its folder
(:class:`~squall.training.declaration.JobDeclaration` in ``protocols/<folder>/protocol.py``) and
found through :mod:`squall.protocols.catalog`. A job may also name any importable
``package.module:function`` directly (a protocol that lives in someone else's package, mounted
into the containers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from squall.job import BadReference, resolve_callable

REGISTRY: dict[str, str] = {
    "noop": "squall.worker.diagnostics:noop",
    "echo_mesh": "squall.worker.diagnostics:echo_mesh",
    "sleep": "squall.worker.diagnostics:sleep",
    "fail": "squall.worker.diagnostics:fail",
    "sysinfo": "squall.worker.diagnostics:sysinfo",
    "udp_probe": "squall.calibration.probes:udp_probe",
    "tcp_goodput": "squall.calibration.probes:tcp_goodput",
    "tcp_rtt": "squall.calibration.probes:tcp_rtt",
    "train": "squall.protocols.train:train",
    "allreduce_bench": "squall.bench.allreduce:allreduce_bench",
    "reach": "squall.worker.reach:reach",
    "command": "squall.worker.local_ranks:run_program",  # one rank, or several (nproc_per_node)
}


class UnknownEntry(LookupError):
    """A job names an entry point that is neither registered nor importable."""


def jobs() -> dict[str, str]:
    """Every job name and its target: :data:`REGISTRY` plus the jobs the protocol folders declare.

    :raises DeclarationError: a protocol folder declares a job name the registry already has.
    """
    from squall.protocols.catalog import discover  # the catalog imports the protocol packages
    from squall.training.declaration import DeclarationError

    declared = discover().jobs
    clash = sorted(REGISTRY.keys() & declared.keys())
    if clash:
        raise DeclarationError(f"jobs {clash} are declared by a protocol folder and by squall/worker/registry.py; "
                               "rename the protocol's job")
    return {**REGISTRY, **{name: job.target for name, job in declared.items()}}


def resolve(entry: str) -> Callable[..., Any]:
    """The callable behind ``entry``: a job name (utility or declared) or ``package.module:function``."""
    target = REGISTRY.get(entry) or (entry if ":" in entry else None)
    if target is None:
        try:
            known = jobs()
        except (ValueError, ImportError) as exc:  # a DeclarationError is a ValueError; the worker reports
            # it as a bad entry, with the cause
            raise UnknownEntry(f"entry point {entry!r}: the protocol declarations cannot be read ({exc})") from exc
        if entry not in known:
            raise UnknownEntry(f"unknown entry point {entry!r}; registered: {sorted(known)}, "
                               "or give 'package.module:function'")
        target = known[entry]
    try:
        return resolve_callable(target, what=f"entry point {entry!r}:" if target != entry else "entry point")
    except BadReference as exc:
        raise UnknownEntry(str(exc)) from exc
