"""Link shaping: pure plans and the backends (netem, nfqueue) that apply them to container namespaces.

Typical use::

    state = state_at(load_profile("wan-5ms"), n=4, at=0.0)
    shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id)   # netem if the kernel has it
    shaper.apply(state)          # first time or a change, all or nothing
    shaper.check()               # raises if shaping silently stopped
    shaper.close()               # clear + stop helpers

Modules: ``base`` (the interface), ``state`` (profile -> LinkState), ``ops`` and ``plan`` (pure:
LinkState -> per-node operations), ``convert`` (units), ``tcdiff`` (old ops -> steps),
``netem_wire`` (netem's netlink options), ``namespace`` (entering a namespace), ``tc`` and
``iptables`` (executors), ``executor`` (all-or-nothing over nodes), ``netem_backend`` and
``nfqueue_backend``, ``probe`` (does the kernel have netem), ``select`` (``open_shaper``), and the
``nfqueue`` package (the delay daemon).
"""

from typing import TYPE_CHECKING, Any

from squall.shaping.base import BACKENDS, Endpoint, LinkState, Shaper, ShapingError
from squall.shaping.ops import NodePlan
from squall.shaping.plan import plan_netem, plan_nfqueue
from squall.shaping.state import state_at

if TYPE_CHECKING:
    from squall.shaping.kernel_probe import netem_available, netem_probe
    from squall.shaping.select import open_shaper

# Imported on first use: they pull in pyroute2, which layers that only need the interface
# (``squall.cluster`` imports ``squall.shaping.base``) should not pay for.
_LAZY = {
    "netem_available": "squall.shaping.kernel_probe",
    "netem_probe": "squall.shaping.kernel_probe",
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
    "Shaper",
    "ShapingError",
    "netem_available",
    "netem_probe",
    "open_shaper",
    "plan_netem",
    "plan_nfqueue",
    "state_at",
]
