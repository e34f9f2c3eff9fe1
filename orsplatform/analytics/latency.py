"""Fixed latency buckets shared by the rollup (which counts calls per bucket) and the selectors
(which read percentiles back). Fixed edges make histograms of different days and tools mergeable.

Below 99.5 ms a bucket is 1 ms wide and centred on a whole millisecond, so latencies are exact to
the millisecond there; above, buckets grow by 2 %, so a percentile is within 1 % of the true value
while a call of an hour still needs only ~560 buckets."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

LINEAR_LIMIT_MS = 99.5
RATIO = 1.02
_LOG_RATIO = math.log(RATIO)
FIRST_LOG_BUCKET = 100


def bucket_of(latency_ms: float) -> int:
    if latency_ms < LINEAR_LIMIT_MS:
        return max(0, int(math.floor(latency_ms + 0.5)))
    return FIRST_LOG_BUCKET + int(math.log(latency_ms / LINEAR_LIMIT_MS) / _LOG_RATIO)


def bucket_value(bucket: int) -> float:
    """The value a bucket stands for: its whole millisecond, or the geometric middle of its edges."""
    if bucket < FIRST_LOG_BUCKET:
        return float(bucket)
    lower = LINEAR_LIMIT_MS * RATIO ** (bucket - FIRST_LOG_BUCKET)
    return lower * math.sqrt(RATIO)


def merge(into: dict[int, int], histogram: Mapping[str | int, int]) -> dict[int, int]:
    for bucket, count in histogram.items():
        key = int(bucket)
        into[key] = into.get(key, 0) + int(count)
    return into


def percentiles(histogram: Mapping[int, int], quantiles: Iterable[float] = (50, 95, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles (the smallest value with at least p % of calls at or below it)."""
    wanted = list(quantiles)
    total = sum(histogram.values())
    if total == 0:
        return {f"p{q:g}": None for q in wanted}
    out: dict[str, float | None] = {}
    ordered = sorted(histogram.items())
    for q in wanted:
        rank = max(1, math.ceil(q / 100 * total))
        seen = 0
        for bucket, count in ordered:
            seen += count
            if seen >= rank:
                out[f"p{q:g}"] = round(bucket_value(bucket), 3)
                break
    return out
