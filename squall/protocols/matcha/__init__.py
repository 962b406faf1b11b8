"""MATCHA (Wang et al. 2019): D-PSGD gossiping over randomly activated matchings of a base graph.

The maths and the mixer are shared (:mod:`squall.gossip.matchings`: decomposition, activation
probabilities, the seeded plan, the mixing step), since other protocols synchronise with MATCHA
too; this folder declares the protocol and builds the training algorithm (:mod:`.sgd`).
"""
