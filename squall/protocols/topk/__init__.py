"""Top-K SGD: every worker sends its ``k`` largest gradient coordinates (values and indices) to all others.

The baseline ARC-Top-K improves on: Top-K's supports differ between workers, so the payloads are
all-gathered (:func:`squall.collectives.allgather.allgather_compressed`), ``(n - 1) 8 k`` bytes per
worker per step, growing with ``n``. Error feedback (EF14 by default) keeps what was dropped.
"""
