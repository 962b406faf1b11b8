"""Options of the lossy_sgd job (the run config's ``algorithm_args``, read by ``read_options``).

=====================  ==========================================================================================
``resync``             owners broadcast their updated shard (true: ``lossy_sgd``) or every worker applies its own
                       reconstruction to its whole copy (false: the ``lossy_sgd_noresync`` control) [true]
``estimator``          how a packet's block is reconstructed from what arrived: ``received_mean`` (sum over the
                       contributions that arrived, own included, / their number), ``inverse_probability``
                       ((own + sum of arrived others / (1 - p)) / N: unbiased) or ``zero_fill`` (sum / N: the
                       biased control, about 1 - p(N-1)/N of the mean) [received_mean]
``assumed_loss``       p for ``inverse_probability``; null: the fraction of expected packets this worker has missed
                       so far (a running estimate) [null]
``deadline_s``         receive deadline of each phase of an iteration (gradients at the owner, broadcasts at every
                       worker): once every peer has sent something of the iteration, what has not arrived
                       ``deadline_s`` later counts as lost (:mod:`squall.protocols.lossy_sgd.inbox`). Set it from the
                       profile: a few times the jitter plus the time a worker takes to send its packets; it
                       needs no one-way delay (the clock starts at a peer's first packet) [0.02]
``spread_s``           the longest a phase waits after the first peer's packet of it for the others to show up (a
                       peer all of whose packets of the phase were lost shows nothing) [0.06]
``max_wait_s``         the longest a phase ever waits (no peer sent anything: they are gone) [2]
``mtu``                interface MTU in bytes; a datagram is MTU - 28 bytes (IPv4 + UDP headers); null: read the
                       MTU of the interface that leads to the peers (1500 if it cannot be read) [null]
``drift_every``        every this many iterations each worker sends its copy of every shard to the owner (probe
                       packets, lost like any other), which records the drift [10]
``window``             iterations ahead of this worker's own that are buffered; datagrams further ahead are
                       dropped and counted as ``future`` [2]
``port``               UDP port on every worker; null: the run's ``port`` [null]
``ready_timeout_s``    how long the start barrier waits for every peer's hello [60]
=====================  ==========================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ESTIMATORS = ("received_mean", "inverse_probability", "zero_fill")


def _fail(key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"lossy_sgd option {key}={value!r} is not allowed: {allowed}")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


@dataclass(frozen=True)
class LossyOptions:
    """See the module docstring."""

    resync: bool = True
    estimator: str = "received_mean"
    assumed_loss: float | None = None
    deadline_s: float = 0.02
    spread_s: float = 0.06
    max_wait_s: float = 2.0
    mtu: int | None = None
    drift_every: int = 10
    window: int = 2
    port: int | None = None
    ready_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.resync, bool):
            raise _fail("resync", self.resync, "true or false")
        if self.estimator not in ESTIMATORS:
            raise _fail("estimator", self.estimator, f"one of {list(ESTIMATORS)}")
        if self.assumed_loss is not None and not (_is_number(self.assumed_loss) and 0 <= self.assumed_loss < 1):
            raise _fail("assumed_loss", self.assumed_loss, "a probability in [0, 1) or null")
        if not (_is_number(self.deadline_s) and 0 < self.deadline_s <= 60):
            raise _fail("deadline_s", self.deadline_s, "seconds in (0, 60]")
        if not (_is_number(self.spread_s) and self.deadline_s <= self.spread_s <= 600):
            raise _fail("spread_s", self.spread_s, f"seconds in [deadline_s = {self.deadline_s}, 600]")
        if not (_is_number(self.max_wait_s) and self.deadline_s <= self.max_wait_s <= 600):
            raise _fail("max_wait_s", self.max_wait_s, f"seconds in [deadline_s = {self.deadline_s}, 600]")
        if self.mtu is not None and not (_is_int(self.mtu) and 576 <= self.mtu <= 65535):
            raise _fail("mtu", self.mtu, "an integer in [576, 65535] or null")
        if not (_is_int(self.drift_every) and self.drift_every >= 1):
            raise _fail("drift_every", self.drift_every, "an integer >= 1")
        if not (_is_int(self.window) and 1 <= self.window <= 64):
            raise _fail("window", self.window, "an integer in [1, 64]")
        if self.port is not None and not (_is_int(self.port) and 1 <= self.port <= 65535):
            raise _fail("port", self.port, "an integer in [1, 65535] or null")
        if not (_is_number(self.ready_timeout_s) and self.ready_timeout_s > 0):
            raise _fail("ready_timeout_s", self.ready_timeout_s, "seconds > 0")
