"""SwarmSGD's options (the job's ``algorithm_args``, read by :func:`squall.training.options.read_options`).

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

from dataclasses import dataclass, field

from squall.protocols.swarm.averaging import QuantizerConfig
from squall.protocols.swarm.schedule import TOPOLOGIES


@dataclass(frozen=True)
class SwarmOptions:
    """How SwarmSGD runs (see the module docstring for the JSON keys)."""

    topology: str = "random_regular"  # interaction graph
    degree: int = 4  # random regular graph's degree
    local_steps: float = 3.0  # H: mean local steps between interactions
    geometric: bool = True  # H_i ~ Geom(1/H) rather than exactly H
    bits: int = QuantizerConfig.bits  # snapshot encoding: 4 or 8 (lattice), 32 (full precision)
    eps: float | None = QuantizerConfig.eps  # fixed lattice spacing; None: per message from the distance
    offer_safety: float = QuantizerConfig.offer_safety  # offers: lattice radius / estimated distance
    answer_safety: float = QuantizerConfig.answer_safety  # answers: lattice radius / true distance
    max_overlap: int = 1  # offers answered while this node's own offer is in flight
    exchange_timeout: float = 5.0  # seconds before an unanswered offer is given up
    drain_timeout: float = 15.0  # seconds to wait for the peers' DONE at the end
    quantizer: QuantizerConfig = field(init=False, repr=False, compare=False)  # the snapshot encoding, from the above

    def __post_init__(self) -> None:
        quantizer = QuantizerConfig(bits=self.bits, eps=self.eps, offer_safety=self.offer_safety,
                                    answer_safety=self.answer_safety)  # checks them
        object.__setattr__(self, "quantizer", quantizer)
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
