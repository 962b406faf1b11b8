"""AL-DSGD: Adjacent Leader Decentralized SGD (He, Wang, Choromanska, arXiv 2405.11389).

Gossip SGD whose neighbour weights follow the neighbours' recent training loss and degree, with a
corrective pull toward the best-performing and the highest-degree neighbour, over a graph that
changes every few iterations. The pure maths is in :mod:`~squall.protocols.al_dsgd.rule` (weights,
leaders, the update) and :mod:`~squall.protocols.al_dsgd.schedule` (dynamic graphs); the exchange of
parameters and a small header over a transport in :mod:`~squall.protocols.al_dsgd.exchange`; the
:class:`~squall.protocols.al_dsgd.sgd.ALDSGD` algorithm in :mod:`~squall.protocols.al_dsgd.sgd`; the training
job, which feeds the algorithm its own loss, in :mod:`~squall.protocols.al_dsgd.job`.

Status: experimental. The paper's weight formula and pull coefficients could not be read; ours
are documented in :mod:`~squall.protocols.al_dsgd.rule`, and how they fare on the scaled-down check
T5.2 is in docs/protocols/al_dsgd.md.
"""
