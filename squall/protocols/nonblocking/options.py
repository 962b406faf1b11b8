"""Non-blocking SGD's options (the job's ``algorithm_args``, read by :func:`squall.training.options.read_options`).

==================  ==============================================================  =================================
key                 meaning                                                         default
==================  ==============================================================  =================================
``microbatches``    b: micro-batches a batch is split into (``batch_size`` must      4
                    be a multiple of it)
``sync``            ``ring``: all-reduce of [gradient sum, count]; ``gossip``: own   ``ring``
                    mean gradient step, then one mix through ``mixer``
``mixer``           gossip only: ``package.module:function`` building the mixer,     D-PSGD's graph mixer
                    called as ``function(transport, **mixer_args)``                 (:data:`DEFAULT_MIXER`)
``mixer_args``      gossip only: the mixer's keyword arguments                      ``{}``
``timeout``         seconds each send and receive of the synchronisation may take    null (the transport's default)
                    (a peer gone makes the step fail after it)
``signal_timeout``  seconds sending a "finished" signal to one peer may take          5.0
==================  ==============================================================  =================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SYNCS = ("ring", "gossip")
DEFAULT_MIXER = "squall.gossip.sgd:graph_mixer"


@dataclass(frozen=True)
class NonblockingOptions:
    """How Non-blocking SGD runs (see the module docstring for the JSON keys)."""

    microbatches: int = 4  # b: micro-batches a batch is split into
    sync: str = "ring"  # one of SYNCS
    mixer: str = DEFAULT_MIXER  # gossip only: "squall.<module>:<function>" building the mixer
    mixer_args: Mapping[str, Any] = field(default_factory=dict)  # gossip only: the mixer's keyword arguments
    timeout: float | None = None  # per send/receive of the synchronisation (None: the transport's default)
    signal_timeout: float = 5.0  # sending a "finished" signal to one peer, s

    def __post_init__(self) -> None:
        if not isinstance(self.microbatches, int) or isinstance(self.microbatches, bool) or self.microbatches < 1:
            raise ValueError(f"nonblocking option microbatches={self.microbatches!r}: must be an integer >= 1")
        if self.sync not in SYNCS:
            raise ValueError(f"nonblocking option sync={self.sync!r}: allowed {list(SYNCS)}")
        module, sep, attr = self.mixer.partition(":")
        if not (sep and module.startswith("squall.") and attr.isidentifier()):
            raise ValueError(f"nonblocking option mixer={self.mixer!r}: must be 'squall.<module>:<function>'")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"nonblocking option timeout={self.timeout!r}: must be > 0 seconds or null")
        if not self.signal_timeout > 0:
            raise ValueError(f"nonblocking option signal_timeout={self.signal_timeout!r}: must be > 0 seconds")
        if not isinstance(self.mixer_args, Mapping):
            raise ValueError(f"nonblocking option mixer_args={self.mixer_args!r}: must be an object")
        object.__setattr__(self, "mixer_args", MappingProxyType(dict(self.mixer_args)))

    def microbatch_size(self, batch_size: int) -> int:
        """Samples per micro-batch; ``batch_size`` must split into ``microbatches`` equal parts."""
        if batch_size % self.microbatches:
            raise ValueError(f"batch_size={batch_size} is not a multiple of nonblocking option "
                             f"microbatches={self.microbatches}")
        return batch_size // self.microbatches
