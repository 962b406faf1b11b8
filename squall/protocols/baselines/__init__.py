"""Baselines that are not ours: real libraries run on the same containers and links, to measure against.

* :mod:`~squall.protocols.baselines.gloo`: ``torch.distributed`` with the gloo backend (all-reduce
  micro-benchmark and all-reduce SGD through the shared training loop).
"""
