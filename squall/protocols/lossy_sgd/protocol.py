"""Training under packet loss: sharded data-parallel SGD over UDP datagrams, no retransmission.

Two declarations of the one job (:mod:`squall.protocols.lossy_sgd.job`):

* ``lossy_sgd``: each worker owns a shard of the parameters; gradient packets go to the shard's
  owner, which averages every packet's block over the contributions that arrived, steps its shard
  and broadcasts it; a worker that misses a broadcast packet keeps its stale coordinates (the
  paper's bounded-drift broadcast).
* ``lossy_sgd_noresync``: the control without broadcasts: every worker sends every shard's gradient
  to every worker and applies its own reconstruction to its whole model, so copies drift apart.

The estimator (``received_mean``, ``inverse_probability`` or the biased ``zero_fill`` control) and
the receive deadline are options (:mod:`squall.protocols.lossy_sgd.options`).
"""

from __future__ import annotations

from typing import Any

from squall.training.declaration import Declaration, JobDeclaration

NAME = "lossy_sgd"  # the protocol and its job
NORESYNC = "lossy_sgd_noresync"  # the control: no parameter broadcast
PAPER = "Distributed Training under Packet Loss, Weintraub, Banner, Orda, arXiv 2507.07114 (2025)"
NEEDS = frozenset({"udp"})


def _config(**args: Any) -> dict[str, Any]:
    return {"algorithm": NAME, "algorithm_args": dict(args)}


DECLARATIONS = (
    JobDeclaration(NAME, "squall.protocols.lossy_sgd.job:lossy_sgd"),
    Declaration(
        NAME,
        "sharded SGD over UDP without retransmission: owners average the gradient packets that arrived, "
        "step their shard and broadcast it; missed packets keep stale coordinates",
        NAME,
        _config(resync=True),
        paper=PAPER,
        needs=NEEDS,
    ),
    Declaration(
        NORESYNC,
        "control for lossy_sgd: every worker reconstructs every shard's gradient from what arrived and "
        "applies it to its own copy; no parameter broadcast, so the copies drift apart",
        NAME,
        _config(resync=False),
        paper=PAPER,
        needs=NEEDS,
    ),
)
