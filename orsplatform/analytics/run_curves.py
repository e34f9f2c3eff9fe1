"""A run's episodes (runs.selectors.RunPoint) as curves against step: per curve and step bucket the
mean reward, pass rate, episode length and error rate, then smoothed.

Pure functions over the selector's points, so the page and its tests share one computation. A
curve is one run, or one run and split / version / environment (the page's "curves per" control),
which is how two runs, or two versions of an environment inside one run, are overlaid.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orsplatform.analytics.order import smooth

MAX_BUCKETS = 200
PER_CHOICES = {"run": "run", "split": "run and split", "version": "run and environment version",
               "environment": "run and environment"}
SMOOTHING_CHOICES = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)
METRICS = ("mean_reward", "pass_rate", "mean_length", "error_rate")


@dataclass
class Bucket:
    lo: int
    hi: int
    episodes: int = 0
    scored: int = 0
    reward_sum: float = 0.0
    passed: int = 0
    length_sum: int = 0
    errors: int = 0
    # The bucket's only episode, when it has one: a click then opens its trajectory directly.
    single: Any = None

    def values(self) -> dict[str, float | None]:
        return {
            "mean_reward": self.reward_sum / self.scored if self.scored else None,
            "pass_rate": self.passed / self.scored * 100 if self.scored else None,
            "mean_length": self.length_sum / self.episodes if self.episodes else None,
            "error_rate": self.errors / self.episodes * 100 if self.episodes else None,
        }


@dataclass
class Curve:
    run: str
    facet: str | None  # the split / version / environment this curve is narrowed to, if any
    label: str
    buckets: list[Bucket] = field(default_factory=list)
    episodes: int = 0

    def series(self, metric: str, weight: float) -> list[dict[str, Any]]:
        """Points of one metric: raw value, smoothed line, bucket range (for the link)."""
        raw = [b.values()[metric] for b in self.buckets]
        line = smooth(raw, weight)
        return [{"x": b.lo if b.lo == b.hi else (b.lo + b.hi) / 2, "lo": b.lo, "hi": b.hi, "y": v, "line": s, "episodes": b.episodes,
                 "single": b.single} for b, v, s in zip(self.buckets, raw, line, strict=True)]


def facet_of(point: Any, per: str) -> str | None:
    if per == "split":
        return point.split or "(none)"
    if per == "version":
        return f"{point.environment}@{point.version}" if point.version is not None else f"{point.environment}@?"
    if per == "environment":
        return point.environment or "(none)"
    return None


def bucket_width(xs: Iterable[int], most: int = MAX_BUCKETS) -> tuple[int, int]:
    """(first x, width): one bucket per step while the steps fit in `most`, else equal-width bins
    over the common range, so every curve of a page is bucketed alike and overlays line up."""
    values = list(xs)
    if not values:
        return 0, 1
    lo, hi = min(values), max(values)
    return lo, max(1, math.ceil((hi - lo + 1) / most))


def build_curves(series_by_run: Sequence[tuple[str, Sequence[Any]]], *, per: str = "run") -> list[Curve]:
    """Curves of several runs' points (RunPoint: x, reward, passed, length, error, ...), bucketed
    on one shared x grid."""
    first, width = bucket_width(p.x for _, points in series_by_run for p in points)
    curves: list[Curve] = []
    for run, points in series_by_run:
        grouped: dict[str | None, dict[int, Bucket]] = defaultdict(dict)
        for p in points:
            k = (p.x - first) // width
            facet = facet_of(p, per)
            bucket = grouped[facet].get(k)
            if bucket is None:
                bucket = grouped[facet][k] = Bucket(lo=first + k * width, hi=first + (k + 1) * width - 1)
            bucket.episodes += 1
            bucket.single = p if bucket.episodes == 1 else None
            if p.reward is not None:
                bucket.scored += 1
                bucket.reward_sum += p.reward
                bucket.passed += 1 if p.passed else 0
            bucket.length_sum += p.length or 0
            bucket.errors += 1 if p.error else 0
        for facet in sorted(grouped, key=lambda f: (f is None, str(f))):
            buckets = [grouped[facet][k] for k in sorted(grouped[facet])]
            label = run if facet is None else f"{run} · {facet}"
            curves.append(Curve(run=run, facet=facet, label=label, buckets=buckets,
                                episodes=sum(b.episodes for b in buckets)))
    return curves


def x_label(series_by_run: Sequence[tuple[str, Sequence[Any]]]) -> str:
    points = [p for _, pts in series_by_run for p in pts]
    stepped = sum(1 for p in points if p.step is not None)
    if points and stepped == len(points):
        return "Training step (RunInfo / RolloutInfo step)"
    if stepped == 0:
        return "Episode (in the order started)"
    return "Step (episode order where no step was logged)"
