"""Rand-K SGD: every worker keeps the same ``k`` random coordinates (a shared per-step seed), so the
kept values are all-reduced over the ring without indices; scaled by ``d/k`` they are unbiased.
"""
