"""AL-DSGD: Adjacent Leader Decentralized SGD (He, Wang, Choromanska, arXiv 2405.11389).

Gossip SGD whose neighbour weights follow the neighbours' recent training loss and degree, with a
corrective pull toward the best-performing and the highest-degree neighbour, over a graph that
changes every few iterations. The pure maths is in :mod:`~squall.protocols.al_dsgd.rule` (weights,
leaders, the update) and :mod:`~squall.protocols.al_dsgd.schedule` (dynamic graphs); the exchange of
parameters and a small header over a transport in :mod:`~squall.protocols.al_dsgd.exchange`; the
:class:`~squall.protocols.al_dsgd.sgd.ALDSGD` algorithm in :mod:`~squall.protocols.al_dsgd.sgd`; the training
job, which feeds the algorithm its own loss, in :mod:`~squall.protocols.al_dsgd.job`.

Status: experimental. The paper's weight formula and pull coefficients could not be read; ours
are documented in :mod:`~squall.protocols.al_dsgd.rule`. On the scaled-down check T5.2 (8 workers, ring,
digits split 2 labels per worker, lr 0.2, batch 16, wan-5ms, 300 steps, 2 seeds) our defaults
ended at 0.921-0.923 mean accuracy against D-PSGD's 0.929-0.931, and the workers' mean reached
0.9 after 180-240 steps against D-PSGD's 160, so they do not meet T5.2's accuracy line there;
its time-to-target line is within the noise of a loaded host (6.4-7.1 s against 6.3-7.0 s).
"""
