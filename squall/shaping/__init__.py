"""Link shaping: pure plans and the backends (netem, nfqueue) that apply them to container namespaces.

Typical use::

    state = state_at(load_profile("wan-5ms"), n=4, at=0.0)
    shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id)   # netem if the kernel has it
    shaper.apply(state)          # first time or a change, all or nothing
    shaper.check()               # raises if shaping silently stopped
    shaper.close()               # clear + stop helpers

Generic modules: ``base`` (the interface), ``state`` (profile -> LinkState), ``ops`` and ``plan``
(pure: the operations both backends share), ``convert`` (checks against the settings table, HTB
sizes), ``tcdiff`` (old ops -> steps), ``netlink`` (message framing), ``namespace`` and ``netns``
(entering a namespace), ``tc``, ``iptables`` and ``nft_table`` (executors), ``executor``
(all-or-nothing over nodes), ``kernel_probe`` (does the kernel take a qdisc), ``features``,
``lan``/``testbed``/``echo_probe`` (namespaces and probes for tests and benchmarks). The backends
are self-contained packages: ``netem`` (its leaf, wire encoding, plan, probe and shaper) and
``nfqueue`` (its plan, the delay daemon, the bridge hold, its host leftovers). Only ``select``
imports them: ``open_shaper``, ``netem_probe`` and ``host_leftovers`` are the way in.
"""

from typing import TYPE_CHECKING, Any

from squall.shaping.base import BACKENDS, Endpoint, LinkState, Shaper, ShapingError
from squall.shaping.changes import NotInPlace, TimedState
from squall.shaping.ops import NodePlan
from squall.shaping.state import link_timeline, state_at

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
