"""Names of the entry points a job may ask for: a name maps to ``"package.module:function"``.

A job may also name any importable ``package.module:function`` directly (a protocol that lives in
someone else's package, mounted into the containers); the registry only gives short names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

REGISTRY: dict[str, str] = {
    "noop": "protocols.jobs.diagnostics:noop",
    "echo_mesh": "protocols.jobs.diagnostics:echo_mesh",
    "sleep": "protocols.jobs.diagnostics:sleep",
    "fail": "protocols.jobs.diagnostics:fail",
    "sysinfo": "protocols.jobs.diagnostics:sysinfo",
    "udp_probe": "protocols.jobs.probes:udp_probe",
    "tcp_goodput": "protocols.jobs.probes:tcp_goodput",
    "tcp_rtt": "protocols.jobs.probes:tcp_rtt",
    "train": "protocols.train:train",
    "gloo_allreduce": "protocols.baselines.gloo:gloo_allreduce",
    "gloo_train": "protocols.baselines.gloo:gloo_train",
    "swarm": "protocols.swarm.job:swarm",
    "moshpit": "protocols.moshpit.jobs:moshpit_train",
    "moshpit_average": "protocols.moshpit.jobs:moshpit_average",
    "allreduce_bench": "protocols.jobs.allreduce_bench:allreduce_bench",
}


class UnknownEntry(LookupError):
    """A job names an entry point that is neither registered nor importable."""


def resolve(entry: str) -> Callable[..., Any]:
    """The callable behind ``entry``: a registry name or ``package.module:function``."""
    target = REGISTRY.get(entry, entry)
    if ":" not in target:
        raise UnknownEntry(f"unknown entry point {entry!r}; registered: {sorted(REGISTRY)}, "
                           "or give 'package.module:function'")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEntry(f"entry point {entry!r}: cannot import {module_name!r} ({exc})") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise UnknownEntry(f"entry point {entry!r}: {module_name!r} has no callable {attr!r}")
    return func  # type: ignore[no-any-return]
