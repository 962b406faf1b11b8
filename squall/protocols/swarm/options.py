"""SwarmSGD's options (the job's ``algorithm_args``), validated into a frozen dataclass.

==================  =========================================================  ==================
key                 meaning                                                    default
==================  =========================================================  ==================
``topology``        ``random_regular``, ``torus``, ``ring``, ``exponential``,   ``random_regular``
                    ``complete``
``degree``          degree of the random regular graph                         4
``local_steps``     mean number ``H`` of local SGD steps between interactions  3
``geometric``       draw ``H_i ~ Geom(1/H)`` (else exactly ``H``)              true
``bits``            4 or 8 (lattice quantizer), 32 (full precision)            8
``eps``             fixed lattice spacing (null: per message from distances)   null
``offer_safety``    offers: lattice radius / estimated distance (initial)      2.0
``answer_safety``   answers: lattice radius / true distance                    1.25
``max_overlap``     offers a node answers while its own is in flight           1
``exchange_timeout`` seconds before an unanswered offer is given up            5.0
``drain_timeout``   seconds to wait at the end for every peer to finish        15.0
==================  =========================================================  ==================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from squall.protocols.swarm.averaging import QuantizerConfig
from squall.protocols.swarm.schedule import TOPOLOGIES

KEYS = frozenset(
    {
        "topology",
        "degree",
        "local_steps",
        "geometric",
        "bits",
        "eps",
        "offer_safety",
        "answer_safety",
        "max_overlap",
        "exchange_timeout",
        "drain_timeout",
    }
)


@dataclass(frozen=True)
class SwarmOptions:
    """How SwarmSGD runs (see the module docstring for the JSON keys)."""

    topology: str = "random_regular"  # interaction graph
    degree: int = 4  # random regular graph's degree
    local_steps: float = 3.0  # H: mean local steps between interactions
    geometric: bool = True  # H_i ~ Geom(1/H) rather than exactly H
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)  # snapshot encoding
    max_overlap: int = 1  # offers answered while this node's own offer is in flight
    exchange_timeout: float = 5.0  # seconds before an unanswered offer is given up
    drain_timeout: float = 15.0  # seconds to wait for the peers' DONE at the end

    def __post_init__(self) -> None:
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.topology!r}; known: {TOPOLOGIES}")
        if self.degree < 2:
            raise ValueError(f"degree must be >= 2, got {self.degree}")
        if not self.local_steps >= 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")
        if self.max_overlap < 0:
            raise ValueError(f"max_overlap must be >= 0, got {self.max_overlap}")
        for name in ("exchange_timeout", "drain_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> SwarmOptions:
        """Validate ``algorithm_args``; unknown keys are rejected."""
        obj = dict(obj or {})
        unknown = sorted(set(obj) - KEYS)
        if unknown:
            raise ValueError(f"swarm options have unknown keys {unknown}; allowed: {sorted(KEYS)}")
        eps = obj.get("eps")
        defaults = QuantizerConfig()
        quantizer = QuantizerConfig(
            bits=int(obj.get("bits", defaults.bits)),
            eps=None if eps is None else float(eps),
            offer_safety=float(obj.get("offer_safety", defaults.offer_safety)),
            answer_safety=float(obj.get("answer_safety", defaults.answer_safety)),
        )
        return cls(
            topology=str(obj.get("topology", "random_regular")),
            degree=int(obj.get("degree", 4)),
            local_steps=float(obj.get("local_steps", 3.0)),
            geometric=bool(obj.get("geometric", True)),
            quantizer=quantizer,
            max_overlap=int(obj.get("max_overlap", 1)),
            exchange_timeout=float(obj.get("exchange_timeout", 5.0)),
            drain_timeout=float(obj.get("drain_timeout", 15.0)),
        )
