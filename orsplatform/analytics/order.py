"""Series against episode order, and their smoothing.

A trainer runs hundreds of episodes inside a minute; against wall-clock buckets those land in one
bucket and a chart collapses to a dot. Against the order the episodes started in, the same data is a
line: consecutive episodes are grouped into at most `points` groups of (nearly) equal size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

ORDER_POINTS = 100
# A time series needs this many buckets with data to read as a line; with fewer (and more episodes
# than buckets) the charts switch to episode order.
MIN_TIME_POINTS = 3


def wants_episode_order(*, buckets_with_data: int, episodes: int) -> bool:
    return buckets_with_data < MIN_TIME_POINTS and episodes > buckets_with_data


def group_in_order(rewards: Iterable[float | None], *, pass_reward: float | None = None,
                   passed: Iterable[bool] | None = None, points: int = ORDER_POINTS) -> list[dict[str, Any]]:
    """Consecutive scored episodes (rewards in order) in at most `points` groups:
    {"first", "last" (1-based episode numbers), "episodes", "mean_reward", "success_rate",
    "cumulative_success_rate"}. An episode passes when its reward reaches `pass_reward`, or as
    `passed` says (an evaluation's faults do not pass whatever they scored)."""
    if passed is None:
        pairs = [(float(r), float(r) >= (pass_reward if pass_reward is not None else 1.0))
                 for r in rewards if r is not None]
    else:
        pairs = [(float(r or 0.0), bool(p)) for r, p in zip(rewards, passed, strict=True)]
    n = len(pairs)
    if not n:
        return []
    groups = min(n, points)
    out, passes_so_far = [], 0
    for g in range(groups):
        lo, hi = g * n // groups, (g + 1) * n // groups
        chunk = pairs[lo:hi]
        passes = sum(1 for _, p in chunk if p)
        passes_so_far += passes
        out.append({"first": lo + 1, "last": hi, "episodes": len(chunk),
                    "mean_reward": sum(v for v, _ in chunk) / len(chunk), "success_rate": passes / len(chunk),
                    "cumulative_success_rate": passes_so_far / hi})
    return out


def order_label(group: dict[str, Any]) -> str:
    return str(group["last"]) if group["first"] == group["last"] else f"{group['first']}–{group['last']}"


def smooth(values: Sequence[float | None], weight: float) -> list[float | None]:
    """Exponential moving average with debiasing (as TensorBoard and W&B smooth): weight 0 is the raw
    series, 0.99 nearly flat. Gaps (None) stay gaps and do not reset the average; the first points
    are not pulled towards zero because the average is divided by the weight it has accumulated."""
    weight = min(max(weight, 0.0), 0.999)
    if weight == 0:
        return list(values)
    out: list[float | None] = []
    last, debias = 0.0, 0.0
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        last = last * weight + (1 - weight) * v
        debias = debias * weight + (1 - weight)
        out.append(last / debias)
    return out
