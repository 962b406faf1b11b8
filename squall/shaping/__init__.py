"""Link shaping: pure plans and the backends (netem, nfqueue) that apply them to container namespaces.

Typical use::

    state = state_at(load_profile("wan-5ms"), n=4, at=0.0)
    shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id)   # netem if the kernel has it
    shaper.apply(state)          # first time or a change, all or nothing
    shaper.check()               # raises if shaping silently stopped
    shaper.close()               # clear + stop helpers

Who does what: ``base`` is the interface every backend implements; ``planning/`` turns a profile
into link states and a state into kernel operations and in-place changes, with no I/O;
``kernel/`` talks to the kernel (enters namespaces, frames netlink, runs tc and iptables, applies
a plan to every node all or nothing); ``capabilities/`` probes what the kernel can do;
``clock/`` runs a run's planned changes at their due times; ``testnet/`` builds hosts in plain
namespaces for tests and benchmarks. The backends are self-contained packages: ``netem`` (its
leaf, wire encoding, plan, probe and shaper) and ``nfqueue`` (its plan, the delay daemon, the
bridge hold, its host leftovers). Only ``select`` imports them: ``open_shaper``, ``netem_probe``
and ``host_leftovers`` are the way in.
"""

from typing import TYPE_CHECKING, Any

from squall.shaping.base import BACKENDS, Endpoint, LinkState, Shaper, ShapingError
from squall.shaping.planning.changes import NotInPlace, TimedState
from squall.shaping.planning.ops import NodePlan
from squall.shaping.planning.state import link_timeline, state_at

if TYPE_CHECKING:
    from squall.shaping.select import netem_available, netem_probe, open_shaper

# Imported on first use: they pull in pyroute2, which layers that only need the interface
# (``squall.cluster`` imports ``squall.shaping.base``) should not pay for.
_LAZY = {
    "netem_available": "squall.shaping.select",
    "netem_probe": "squall.shaping.select",
    "open_shaper": "squall.shaping.select",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "Endpoint",
    "LinkState",
    "NodePlan",
    "NotInPlace",
    "Shaper",
    "ShapingError",
    "TimedState",
    "link_timeline",
    "netem_available",
    "netem_probe",
    "open_shaper",
    "state_at",
]
