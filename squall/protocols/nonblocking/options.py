"""Non-blocking SGD's options (the job's ``algorithm_args``), validated into a frozen dataclass.

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
KEYS = frozenset({"microbatches", "sync", "mixer", "mixer_args", "timeout", "signal_timeout"})


@dataclass(frozen=True)
class NonblockingOptions:
    """How Non-blocking SGD runs (see the module docstring for the JSON keys)."""

    microbatches: int = 4
    sync: str = "ring"
    mixer: str = DEFAULT_MIXER
    mixer_args: Mapping[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    signal_timeout: float = 5.0

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

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> NonblockingOptions:
        """Validate ``algorithm_args``; unknown keys are rejected."""
        obj = dict(obj or {})
        unknown = sorted(set(obj) - KEYS)
        if unknown:
            raise ValueError(f"nonblocking options have unknown keys {unknown}; allowed: {sorted(KEYS)}")
        timeout = obj.get("timeout")
        return cls(
            microbatches=obj.get("microbatches", 4),
            sync=str(obj.get("sync", "ring")),
            mixer=str(obj.get("mixer", DEFAULT_MIXER)),
            mixer_args=obj.get("mixer_args", {}),
            timeout=None if timeout is None else float(timeout),
            signal_timeout=float(obj.get("signal_timeout", 5.0)),
        )

    def microbatch_size(self, batch_size: int) -> int:
        """Samples per micro-batch; ``batch_size`` must split into ``microbatches`` equal parts."""
        if batch_size % self.microbatches:
            raise ValueError(f"batch_size={batch_size} is not a multiple of nonblocking option "
                             f"microbatches={self.microbatches}")
        return batch_size // self.microbatches
