"""Stochastic Gradient Push: push-sum gossip SGD on a directed schedule (:mod:`~squall.protocols.sgp.sgd`)."""
