"""SwarmSGD (Nadiradze et al., NeurIPS 2021): asynchronous pairwise averaging with local steps and quantization.

Nodes sit on a graph (random regular by default). Each takes ``H_i ~ Geom(1/H)`` local SGD steps,
then offers an exchange to a random neighbour without waiting for it; the pair add half the
difference of their (lattice-quantized) snapshots to whatever their models have become, so the
local progress made during the exchange is kept and the sum of the models never changes.

* the quantizer is the shared reference-point lattice, :mod:`squall.training.compress.lattice`;
* :mod:`~squall.protocols.swarm.averaging`: one interaction's maths: encodings and the increment;
* :mod:`~squall.protocols.swarm.schedule`: graphs, local-step and partner draws;
* :mod:`~squall.protocols.swarm.frames`: the messages and their bytes;
* :mod:`~squall.protocols.swarm.node`: offers, answers, busy/resend rules and the end of a run;
* :mod:`~squall.protocols.swarm.driver`: the asynchronous training driver (:class:`SwarmTrainer`);
* :mod:`~squall.protocols.swarm.options`: the job's options; :mod:`~squall.protocols.swarm.job`: the ``swarm``
  entry point.
"""

from __future__ import annotations

from squall.protocols.swarm.averaging import QuantizerConfig
from squall.protocols.swarm.driver import SwarmTrainer
from squall.protocols.swarm.node import SwarmNode
from squall.protocols.swarm.options import SwarmOptions
from squall.protocols.swarm.schedule import random_regular_graph, swarm_graph

__all__ = [
    "QuantizerConfig",
    "SwarmNode",
    "SwarmOptions",
    "SwarmTrainer",
    "random_regular_graph",
    "swarm_graph",
]
