"""ARC-Top-K (Chen et al., arXiv 2510.26709): an all-reduce compatible Top-K with EF21M.

A Gaussian sketch from a per-step shared seed is all-reduced, picks the same top rows on every
worker, and those rows are all-reduced without indices (:mod:`squall.training.compress.arc`
holds the maths, :mod:`.sgd` drives it over the ring). Error feedback is EF21M by default.
"""
