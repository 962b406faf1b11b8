"""A small log-linear histogram of non-negative integer microseconds, for release lateness.

Values below 2048 us get their own bucket (exact); above that each power of two is split into
1024 buckets, so a percentile is exact to 0.1 %. Recording is O(1) and allocation free, which
matters on the daemon's per-release path.
"""

from __future__ import annotations

import math

_LINEAR = 2048
_SUB_BITS = 10
_SUB = 1 << _SUB_BITS


def _index(value: int) -> int:
    if value < _LINEAR:
        return value
    shift = value.bit_length() - _SUB_BITS - 1
    return _LINEAR + (shift - 1) * _SUB + ((value >> shift) - _SUB)


def _lower_bound(index: int) -> int:
    if index < _LINEAR:
        return index
    shift, sub = divmod(index - _LINEAR, _SUB)
    shift += 1
    return (sub + _SUB) << shift


class Histogram:
    """Counts of integer values; negative values are recorded as 0."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.count = 0
        self.max = 0
        self.total = 0

    def record(self, value: int, weight: int = 1) -> None:
        """Add ``weight`` observations of ``value``."""
        value = max(value, 0)
        idx = value if value < _LINEAR else _index(value)
        counts = self._counts
        counts[idx] = counts.get(idx, 0) + weight
        self.count += weight
        self.total += value * weight
        self.max = max(self.max, value)

    def merge(self, other: Histogram) -> None:
        """Add every observation of ``other``."""
        for idx, n in other._counts.items():
            self._counts[idx] = self._counts.get(idx, 0) + n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> int:
        """Smallest bucket bound with at least ``q`` percent of the observations at or below it."""
        if not self.count:
            return 0
        rank = max(1, math.ceil(self.count * q / 100 - 1e-9))  # tolerate float error in q
        seen = 0
        for idx in sorted(self._counts):
            seen += self._counts[idx]
            if seen >= rank:
                return min(_lower_bound(idx), self.max)
        return self.max

    def summary(self) -> dict[str, float]:
        """Count, mean, p50, p90, p99, p99.9 and max, for the stats command."""
        return {
            "count": self.count,
            "mean_us": round(self.total / self.count, 1) if self.count else 0.0,
            "p50_us": self.percentile(50),
            "p90_us": self.percentile(90),
            "p99_us": self.percentile(99),
            "p999_us": self.percentile(99.9),
            "max_us": self.max,
        }
