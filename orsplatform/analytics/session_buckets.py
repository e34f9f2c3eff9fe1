"""Fixed histogram buckets of ended sessions, shared by the session rollup (which counts sessions per
bucket) and the pages (which draw histograms back from the summed counts), like latency.py for calls.

Three kinds. REWARD_UNIT: a reward within [0, 1] in its tenth (the pages' fixed bins 0–0.1 … 0.9–1,
computed with the same expression as before, so these histograms are exact). REWARD_WIDE: every
reward, to the hundredth (for windows whose rewards leave [0, 1]: ten equal bins over the exact
minimum and maximum, each value placed by its hundredth). LENGTH: an ended episode's tool calls,
exactly."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

REWARD_UNIT, REWARD_WIDE, LENGTH = 0, 1, 2
REWARD_BINS = 10
# The epsilon keeps values that sit on an edge (0.3 / 0.1 = 2.9999999999999996) in the bin that
# the edge opens, as a reader of the axis expects (the same as the pages' former SQL).
EDGE_EPSILON = 1e-9
_WIDE_LIMIT = 9 * 10**17


def reward_unit_bucket(reward: float) -> int | None:
    if 0.0 <= reward <= 1.0:
        return int(math.floor((reward - 0.0) / (1 / REWARD_BINS) + EDGE_EPSILON))
    return None


def reward_wide_bucket(reward: float) -> int:
    return max(-_WIDE_LIMIT, min(_WIDE_LIMIT, round(reward * 100)))


def buckets_of(reward: float | None, calls: int) -> list[tuple[int, int]]:
    """The (kind, bucket) pairs one ended session counts in (its reward only when scored)."""
    out = [(LENGTH, int(calls))]
    if reward is not None:
        out.append((REWARD_WIDE, reward_wide_bucket(reward)))
        unit = reward_unit_bucket(reward)
        if unit is not None:
            out.append((REWARD_UNIT, unit))
    return out


def _bins(counts: list[int], lo: float, width: float, integer: bool) -> list[dict[str, Any]]:
    edge = (lambda i: lo + i * width) if not integer else (lambda i: int(lo + i * width))
    return [{"lo": round(edge(i), 10), "hi": round(edge(i + 1), 10), "count": c} for i, c in enumerate(counts)]


def reward_histogram(unit: Mapping[int, int], wide: Mapping[int, int], *, count: int, lo: float | None,
                     hi: float | None) -> list[dict[str, Any]]:
    """Ten bins of scored rewards: fixed 0–1 tenths when every reward is within [0, 1], else equal
    widths over [lo, hi] (lo and hi exact, from the rollup's minimum and maximum)."""
    if not count or lo is None or hi is None:
        return []
    lo, hi = float(lo), float(hi)
    counts = [0] * REWARD_BINS
    if lo >= 0 and hi <= 1:
        for bucket, n in unit.items():
            counts[min(REWARD_BINS - 1, max(0, bucket))] += n
        return _bins(counts, 0.0, 1 / REWARD_BINS, False)
    if lo == hi:
        return [{"lo": lo, "hi": hi, "count": count}]
    width = (hi - lo) / REWARD_BINS
    for bucket, n in wide.items():
        index = math.floor((bucket / 100 - lo) / width + EDGE_EPSILON)
        counts[min(REWARD_BINS - 1, max(0, index))] += n
    return _bins(counts, lo, width, False)


def length_histogram(lengths: Mapping[int, int], *, count: int, longest: int | None) -> list[dict[str, Any]]:
    """Episode lengths: one bin per call count up to 30, else twenty-odd equal bins from 0."""
    if not count or longest is None:
        return []
    hi = float(longest)
    width = 1.0 if hi <= 30 else float(math.ceil((hi + 1) / 20))
    bins = int(hi // width) + 1
    counts = [0] * bins
    for calls, n in lengths.items():
        counts[min(bins - 1, max(0, int(math.floor(calls / width + EDGE_EPSILON))))] += n
    return _bins(counts, 0.0, width, True)
