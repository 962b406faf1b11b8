"""Top-K SGD: every worker sends its ``k`` largest gradient coordinates (values and indices) to all others.

The baseline ARC-Top-K improves on: Top-K's supports differ between workers, so
:func:`squall.collectives.allreduce` all-gathers the payloads of its
:class:`~squall.training.compress.TopK` compressor, ``(n - 1) 8 k`` bytes per worker per step,
growing with ``n``. Error feedback (EF14 by default) keeps what was dropped.
"""
