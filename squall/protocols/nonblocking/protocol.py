"""Non-blocking SGD (He & Dube, arXiv 2211.00889) over three synchronisations: ring all-reduce, D-PSGD, MATCHA."""

from __future__ import annotations

from squall.training.declaration import Declaration, JobDeclaration

JOB = "nonblocking"  # the job every variant runs
RING = "nonblocking_ring"
DPSGD = "nonblocking_dpsgd"
MATCHA = "nonblocking_matcha"
NAMES = (RING, DPSGD, MATCHA)

MICROBATCHES = 4  # b: the default batch of 32 in micro-batches of 8
_PAPER = "Non-blocking SGD, He & Dube, arXiv 2211.00889"
_NEEDS = frozenset({"tcp", "device_model"})
#: D-PSGD's and MATCHA's mixers from the shared gossip layer, by reference (sync.py says why), with the
#: settings of their own protocols' declarations: D-PSGD on a ring, MATCHA on a ring at budget 0.5.
GRAPH_MIXER = "squall.gossip.sgd:graph_mixer"
MATCHA_MIXER = "squall.gossip.matchings.mixer:matcha_mixer"

DECLARATIONS = (
    JobDeclaration(JOB, "squall.protocols.nonblocking.job:nonblocking"),
    Declaration(
        RING,
        "Non-blocking SGD: micro-batches until the first worker finishes, count-weighted ring all-reduce",
        JOB,
        {"algorithm": RING, "algorithm_args": {"microbatches": MICROBATCHES, "sync": "ring"}},
        paper=_PAPER,
        needs=_NEEDS,
    ),
    Declaration(
        DPSGD,
        "Non-blocking SGD: micro-batches until the first worker finishes, own step then D-PSGD mix on a ring",
        JOB,
        {"algorithm": DPSGD, "algorithm_args": {"microbatches": MICROBATCHES, "sync": "gossip",
                                                "mixer": GRAPH_MIXER, "mixer_args": {"topology": "ring"}}},
        paper=_PAPER,
        needs=_NEEDS,
    ),
    Declaration(
        MATCHA,
        "Non-blocking SGD: micro-batches until the first worker finishes, own step then MATCHA mix (ring, 0.5)",
        JOB,
        {"algorithm": MATCHA, "algorithm_args": {"microbatches": MICROBATCHES, "sync": "gossip",
                                                 "mixer": MATCHA_MIXER,
                                                 "mixer_args": {"topology": "ring", "budget": 0.5}}},
        paper=_PAPER,
        needs=_NEEDS,
    ),
)
