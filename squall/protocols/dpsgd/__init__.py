"""D-PSGD: gossip SGD with a fixed mixing matrix on a ring, a torus or an exponential graph.

The algorithm is the shared gossip layer's :class:`~squall.gossip.sgd.GossipSGD` with a graph
mixer; :mod:`~squall.protocols.dpsgd.protocol` declares it and the three named protocols.
"""
