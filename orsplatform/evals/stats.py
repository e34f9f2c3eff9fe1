"""Summary statistics of a run: pass rate with a Wilson score interval, mean reward with a
normal-approximation interval (t for small n would be a few percent wider; n is usually large)."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """95 % interval of a pass rate; it stays inside [0, 1] and is sensible at 0/n and n/n."""
    if n <= 0:
        return None
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(n: int, total: float, total_sq: float, z: float = Z95) -> tuple[float | None, tuple[float, float] | None]:
    """(mean, 95 % interval) from n, sum and sum of squares (one pass over the rows, in SQL)."""
    if n <= 0:
        return None, None
    mean = total / n
    if n == 1:
        return mean, (mean, mean)
    variance = max(0.0, (total_sq - n * mean * mean) / (n - 1))
    half = z * math.sqrt(variance / n)
    return mean, (mean - half, mean + half)
