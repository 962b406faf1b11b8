"""NFQUEUE shaping backend: a userspace delay daemon for kernels without ``sch_netem``.

Packets are delayed on the bridge between the namespaces, after they left the sender and before
the receiver's kernel sees them (so ``ping`` and receive timestamps there see the delay). In the
bridge's namespace (the host's, for Docker) one iptables rule per directed link in the run's chain
in ``mangle PREROUTING`` sends its packets to its own NFQUEUE (:mod:`.hold_plan`, run by
:mod:`.hold`). One daemon process on the host (:mod:`.daemon`) keeps each packet until its link
model (:mod:`.engine`) says it is due, and then issues the ACCEPT verdict (or DROP for loss). The
harness starts and watches it with :mod:`.launcher` and changes links at run time through
:mod:`.control`. (:mod:`.rules` installs a fixed rule set in one namespace, for the daemon's own
tests and tools.)

Modules, one job each: ``plan`` (LinkState -> node plans and the daemon's queues, the LinkParams of
a link), ``backend`` (the shaper), ``config`` (frozen dataclasses, JSON), ``jitter``/``loss``/``engine``
(pure link models), ``histogram`` and ``scheduler`` (pure timing), ``netlink`` (the queue protocol
and socket), ``timer`` (ctypes syscalls), ``state`` and ``daemon`` (the event loop), ``cli`` (the
process entry point, ``python -m squall.shaping.nfqueue.cli``), ``server``/``control`` (control
protocol), ``launcher`` (process), ``hold_plan`` and ``hold`` (where packets wait: the bridge),
``leftovers`` (what the backend keeps on the host, for ``squall gc``), ``rules`` (a fixed NFQUEUE
rule set in one namespace, for the daemon's own tests and tools). Generic helpers it uses live in
:mod:`squall.shaping` (namespaces, netlink framing, iptables-save helpers, ``nft_table``).
"""

from __future__ import annotations

from .config import DaemonConfig, GilbertElliott, LinkParams, NamespaceSpec, QueueSpec
from .control import ControlClient
from .engine import DROP, LinkModel
from .errors import ConfigError, ControlError, DaemonDied, NfqueueError, RulesError
from .launcher import DaemonProcess
from .rules import InstalledRules, SourceRule

__all__ = [
    "DROP",
    "ConfigError",
    "ControlClient",
    "ControlError",
    "DaemonConfig",
    "DaemonDied",
    "DaemonProcess",
    "GilbertElliott",
    "InstalledRules",
    "LinkModel",
    "LinkParams",
    "NamespaceSpec",
    "NfqueueError",
    "QueueSpec",
    "RulesError",
    "SourceRule",
]
