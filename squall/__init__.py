"""Squall: distributed-training protocols on emulated bad networks.

Worker side (runs in the containers): ``wire``, ``transport``, ``job``, ``training``,
``collectives``, ``gossip``, ``protocols``, ``worker``, ``bench``, ``calibration.probes``.
Host side: ``profiles``, ``shaping``, ``cluster``, ``calibration``, ``trace``, ``checks``,
``experiment``, ``claims``, ``report``, ``cli``, ``pytest_plugin``. docs/architecture.md has the layers.

``from squall import log`` is for users' own programs run by ``squall run -- COMMAND``
(:mod:`squall.record`): one call per step gives Squall the program's figures; ``squall.fingerprint(model)``
(:mod:`squall.fingerprint`) a short digest of its parameters to print at the end (``--agree``).
"""

from squall.fingerprint import fingerprint
from squall.record import log

__all__ = ["fingerprint", "log"]
