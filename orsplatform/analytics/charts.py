"""Server-rendered SVG charts: histogram, time series and horizontal bars.

Pictures are drawn on the server so the pages need no JavaScript and no chart library (nothing is
fetched from a CDN at run time), and so a chart is also an accessible image: every SVG has a
<title> and <desc>, labelled axes with units, and a <title> on each data mark for hover tooltips.
Every label is escaped here, because tool names and split names are chosen by tenants.
Data marks carry class="mark" (the browser tests count them); an empty chart draws its frame and a
note instead and carries data-empty="true".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from html import escape

from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 660, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 14, 56
COLORS = ("#2454d6", "#d97706", "#17713a", "#9333ea", "#b3261e")
EMPTY_NOTE = "No data in this time range."
_ids = itertools.count(1)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def fmt(value: float | None, *, digits: int = 3) -> str:
    """A short human number: 12,345 · 0.25 · 1.5k is avoided so axes read exactly."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 1:
        return f"{value:,.{max(0, digits - 1)}f}".rstrip("0").rstrip(".")
    return f"{value:.{digits}g}"


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 × 10^n steps; whole steps for counts)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, count)
    if integer:
        raw = max(raw, 1.0)
    power = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * power for m in steps if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _open(chart_id: str, title: str, desc: str, *, height: int = HEIGHT, empty: bool = False) -> list[str]:
    return [
        f'<svg class="chart" id="{chart_id}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-labelledby="{chart_id}-t {chart_id}-d" data-empty="{str(empty).lower()}" '
        f'preserveAspectRatio="xMidYMid meet">',
        f'<title id="{chart_id}-t">{_e(title)}</title><desc id="{chart_id}-d">{_e(desc)}</desc>',
    ]


def _axes(parts: list[str], *, x_label: str, y_label: str, height: int = HEIGHT) -> None:
    bottom = height - BOTTOM
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#8a94a3"/>')
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#8a94a3"/>')
    parts.append(f'<text class="axis-label" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{height - 10}" text-anchor="middle" '
                 f'font-size="12" fill="#445">{_e(x_label)}</text>')
    cy = (TOP + bottom) / 2
    parts.append(f'<text class="axis-label" x="14" y="{cy}" text-anchor="middle" font-size="12" fill="#445" '
                 f'transform="rotate(-90 14 {cy})">{_e(y_label)}</text>')


def _y_scale(parts: list[str], lo: float, hi: float, *, height: int = HEIGHT, percent: bool = False,
             integer: bool = False):
    ticks = nice_ticks(lo, hi, integer=integer)
    lo, hi = ticks[0], ticks[-1]
    bottom = height - BOTTOM

    def y(value: float) -> float:
        return bottom - (value - lo) / (hi - lo) * (bottom - TOP)

    for tick in ticks:
        ty = y(tick)
        parts.append(f'<line x1="{LEFT}" y1="{ty:.1f}" x2="{WIDTH - RIGHT}" y2="{ty:.1f}" stroke="#eef0f3"/>')
        label = fmt(tick) + ("%" if percent else "")
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#667">{_e(label)}</text>')
    return y


def _empty(parts: list[str], note: str, *, height: int = HEIGHT) -> None:
    parts.append(f'<text class="empty-note" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{(TOP + height - BOTTOM) / 2}" '
                 f'text-anchor="middle" font-size="14" fill="#667">{_e(note)}</text>')


def histogram(bins: Sequence[dict], *, title: str, x_label: str, y_label: str,
              integer_edges: bool = False, note: str = EMPTY_NOTE) -> SafeString:
    """Bars over adjacent bins ({"lo", "hi", "count"}); the x axis is labelled at the bin edges."""
    chart_id = f"chart-{next(_ids)}"
    total = sum(b["count"] for b in bins)
    empty = total == 0
    desc = "No data." if empty else "; ".join(
        f"{fmt(b['lo'])} to {fmt(b['hi'])}: {fmt(b['count'])}" for b in bins)
    parts = _open(chart_id, title, desc, empty=empty)
    _axes(parts, x_label=x_label, y_label=y_label)
    if empty:
        _empty(parts, note)
        parts.append("</svg>")
        return mark_safe("".join(parts))
    y = _y_scale(parts, 0, max(b["count"] for b in bins), integer=True)
    bottom = HEIGHT - BOTTOM
    plot_w = WIDTH - RIGHT - LEFT
    slot = plot_w / len(bins)
    label_every = max(1, math.ceil(len(bins) / 12))
    for i, b in enumerate(bins):
        x = LEFT + i * slot
        top = y(b["count"])
        label = (f"{fmt(b['lo'])}" if integer_edges and b["hi"] - b["lo"] <= 1
                 else f"{fmt(b['lo'])}–{fmt(b['hi'])}")
        parts.append(
            f'<rect class="mark" x="{x + 1:.1f}" y="{top:.1f}" width="{max(1.0, slot - 2):.1f}" '
            f'height="{max(0.0, bottom - top):.1f}" fill="{COLORS[0]}" data-value="{b["count"]}">'
            f'<title>{_e(label)}: {_e(fmt(b["count"]))}</title></rect>')
        if i % label_every == 0:
            edge = fmt(b["lo"]) if not integer_edges or b["hi"] - b["lo"] > 1 else fmt(b["lo"])
            tx = x + (slot / 2 if integer_edges and b["hi"] - b["lo"] <= 1 else 0)
            parts.append(f'<text class="tick" x="{tx:.1f}" y="{bottom + 15}" text-anchor="middle" font-size="11" '
                         f'fill="#667">{_e(edge)}</text>')
    if not (integer_edges and bins[-1]["hi"] - bins[-1]["lo"] <= 1):
        parts.append(f'<text class="tick" x="{WIDTH - RIGHT:.1f}" y="{bottom + 15}" text-anchor="middle" '
                     f'font-size="11" fill="#667">{_e(fmt(bins[-1]["hi"]))}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))


STEPS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1),
         "week": timedelta(days=7)}


def _time_label(moment: datetime, granularity: str, span_days: float) -> str:
    if granularity == "minute":
        return moment.strftime("%H:%M")
    if granularity == "hour":
        return moment.strftime("%H:%M") if span_days < 1 else moment.strftime("%d %b %H:%M")
    if span_days > 370:
        return moment.strftime("%b %Y")
    return moment.strftime("%d %b")


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M")


def time_series(times: Sequence[datetime], series: Sequence[tuple[str, Sequence[float | None]]], *, title: str,
                y_label: str, granularity: str, percent: bool = False, y_min: float | None = 0,
                y_max: float | None = None, counts: bool = False, note: str = EMPTY_NOTE) -> SafeString:
    """Lines with a point per time bucket; None leaves a gap. Several series get a legend.
    Counts (counts=True) that are all zero are no data, drawn as an empty chart with the note.
    Each point carries its period (data-start, data-end), so a click can zoom the page to it."""
    if counts and not any(v for _, vs in series for v in vs):
        series = [(name, [None] * len(vs)) for name, vs in series]
    if percent and y_max is None:
        y_max = 100.0
    span_days = (times[-1] - times[0]).total_seconds() / 86400 if len(times) > 1 else 0
    step = STEPS.get(granularity, timedelta(hours=1))
    fmt_name = "%Y-%m-%d %H:%M"
    return lines(
        [_time_label(t, granularity, span_days) for t in times],
        [t.strftime(fmt_name) for t in times], series, title=title,
        x_label=f"Time (UTC, one point per {granularity})", y_label=y_label, percent=percent, y_min=y_min,
        y_max=y_max, integer=counts, note=note, ranges=[(_iso(t), _iso(t + step)) for t in times])


def _label_positions(n: int, most: int = 7) -> list[int]:
    """Indices to label: evenly spaced, always the first and the last, never two crowding each other."""
    if n <= most:
        return list(range(n))
    every = math.ceil((n - 1) / (most - 1))
    picks = list(range(0, n, every))
    if picks[-1] != n - 1:
        if n - 1 - picks[-1] < every / 2:
            picks[-1] = n - 1
        else:
            picks.append(n - 1)
    return picks


def lines(labels: Sequence[str], point_names: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], *,
          title: str, x_label: str, y_label: str, percent: bool = False, y_min: float | None = 0,
          y_max: float | None = None, integer: bool = False, note: str = EMPTY_NOTE,
          ranges: Sequence[tuple[str, str]] | None = None) -> SafeString:
    """Lines over evenly spaced, labelled x positions (time buckets, steps of an episode)."""
    chart_id = f"chart-{next(_ids)}"
    values = [v for _, vs in series for v in vs if v is not None]
    n = len(labels)
    empty = not values or n == 0
    desc = "No data." if empty else f"{n} points from {point_names[0]} to {point_names[-1]}."
    parts = _open(chart_id, title, desc, empty=empty)
    _axes(parts, x_label=x_label, y_label=y_label)
    if empty:
        _empty(parts, note)
        parts.append("</svg>")
        return mark_safe("".join(parts))
    lo = min(values) if y_min is None else min(y_min, min(values))
    hi = max(values) if y_max is None else max(y_max, max(values))
    y = _y_scale(parts, lo, hi if hi > lo else lo + 1, percent=percent, integer=integer)
    bottom = HEIGHT - BOTTOM
    plot_w = WIDTH - RIGHT - LEFT - 8

    def x(i: int) -> float:
        return LEFT + 4 + (plot_w / 2 if n == 1 else i * plot_w / (n - 1))

    for i in _label_positions(n):
        # The end labels are anchored inward so they never run past the chart's edges.
        anchor = "middle" if n == 1 or 0 < i < n - 1 else ("start" if i == 0 else "end")
        tx = x(i) - (6 if anchor == "start" else 0) + (6 if anchor == "end" else 0)
        parts.append(f'<text class="tick x-tick" x="{tx:.1f}" y="{bottom + 15}" text-anchor="{anchor}" '
                     f'font-size="11" fill="#667">{_e(labels[i])}</text>')
    radius = 3.0 if n <= 60 else 2.0
    for s, (name, vs) in enumerate(series):
        color = COLORS[s % len(COLORS)]
        runs: list[list[str]] = [[]]
        for i, v in enumerate(vs):
            if v is None:
                runs.append([])
                continue
            runs[-1].append(f"{x(i):.1f},{y(v):.1f}")
        for run in runs:
            if len(run) > 1:
                parts.append(f'<polyline class="line" points="{" ".join(run)}" fill="none" stroke="{color}" '
                             f'stroke-width="2"/>')
        for i, v in enumerate(vs):
            if v is None:
                continue
            label = f"{point_names[i]} · {name}: {fmt(v)}{'%' if percent else ''}"
            zoom = f' data-start="{_e(ranges[i][0])}" data-end="{_e(ranges[i][1])}"' if ranges else ""
            parts.append(f'<circle class="mark" cx="{x(i):.1f}" cy="{y(v):.1f}" r="{radius}" fill="{color}" '
                         f'data-value="{v}"{zoom}><title>{_e(label)}</title></circle>')
    if len(series) > 1:
        lx = LEFT + 12
        for s, (name, _) in enumerate(series):
            color = COLORS[s % len(COLORS)]
            parts.append(f'<rect x="{lx}" y="{TOP + 2}" width="10" height="10" fill="{color}"/>'
                         f'<text class="legend" x="{lx + 14}" y="{TOP + 11}" font-size="11" fill="#334">{_e(name)}</text>')
            lx += 26 + 7 * len(name)
    parts.append("</svg>")
    return mark_safe("".join(parts))


def bars(items: Sequence[tuple[str, float]], *, title: str, x_label: str, percent: bool = False,
         note: str = EMPTY_NOTE) -> SafeString:
    """Horizontal bars, one per labelled item (the labels are on the left, values at the bar ends)."""
    chart_id = f"chart-{next(_ids)}"
    items = list(items)[:20]
    empty = not items
    row = 24
    label_w = 170
    height = max(120, TOP + BOTTOM + row * len(items))
    desc = "No data." if empty else "; ".join(f"{label}: {fmt(v)}{'%' if percent else ''}" for label, v in items)
    parts = _open(chart_id, title, desc, height=height, empty=empty)
    bottom = height - BOTTOM
    left = label_w
    parts.append(f'<line class="axis" x1="{left}" y1="{TOP}" x2="{left}" y2="{bottom}" stroke="#8a94a3"/>')
    parts.append(f'<line class="axis" x1="{left}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}" stroke="#8a94a3"/>')
    parts.append(f'<text class="axis-label" x="{(left + WIDTH - RIGHT) / 2}" y="{height - 10}" text-anchor="middle" '
                 f'font-size="12" fill="#445">{_e(x_label)}</text>')
    if empty:
        parts.append(f'<text class="empty-note" x="{(left + WIDTH - RIGHT) / 2}" y="{(TOP + bottom) / 2}" '
                     f'text-anchor="middle" font-size="14" fill="#667">{_e(note)}</text></svg>')
        return mark_safe("".join(parts))
    hi = max(v for _, v in items)
    if percent:
        hi = max(hi, 100.0)
    ticks = nice_ticks(0, hi if hi > 0 else 1, 4, integer=all(float(v).is_integer() for _, v in items) and not percent)
    top_tick = ticks[-1]
    plot_w = WIDTH - RIGHT - left - 40

    def x(value: float) -> float:
        return left + value / top_tick * plot_w

    for tick in ticks:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{TOP}" x2="{x(tick):.1f}" y2="{bottom}" stroke="#eef0f3"/>')
        parts.append(f'<text class="tick" x="{x(tick):.1f}" y="{bottom + 15}" text-anchor="middle" font-size="11" '
                     f'fill="#667">{_e(fmt(tick) + ("%" if percent else ""))}</text>')
    for i, (label, value) in enumerate(items):
        ty = TOP + i * row + 4
        short = label if len(label) <= 24 else label[:23] + "…"
        shown = fmt(value) + ("%" if percent else "")
        parts.append(f'<text class="tick" x="{left - 6}" y="{ty + 12}" text-anchor="end" font-size="11" '
                     f'fill="#334">{_e(short)}</text>')
        parts.append(f'<rect class="mark" x="{left}" y="{ty}" width="{max(1.0, x(value) - left):.1f}" height="{row - 8}" '
                     f'fill="{COLORS[0]}" data-value="{value}"><title>{_e(label)}: {_e(shown)}</title></rect>')
        parts.append(f'<text x="{x(value) + 4:.1f}" y="{ty + 12}" font-size="11" fill="#334">{_e(shown)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))


PALETTE = COLORS + ("#0e7490", "#be185d", "#4d7c0f", "#7c2d12", "#475569")


def color_of(index: int) -> str:
    """The colour of the index-th curve: the same in every chart of a page and in its legend."""
    return PALETTE[index % len(PALETTE)]


def xy_lines(curves: Sequence[tuple[str, Sequence[dict]]], *, title: str, x_label: str, y_label: str,
             percent: bool = False, y_min: float | None = 0, y_max: float | None = None,
             note: str = "No episodes.") -> SafeString:
    """Lines over a numeric x axis (training steps), one per curve, several overlaid. Each point is a
    dict {"x", "y" (raw value or None), "line" (the smoothed value drawn as the line, default y),
    "href" (where a click goes: its trajectories), "label" (tooltip)}. The raw values are the marks
    (links); the line goes through the smoothed ones, so smoothing never hides what was measured.
    Curves keep their colours by position (color_of), so a page draws one legend for all its charts."""
    chart_id = f"chart-{next(_ids)}"
    xs = [p["x"] for _, pts in curves for p in pts if p.get("y") is not None]
    ys = [v for _, pts in curves for p in pts for v in (p.get("y"), p.get("line")) if v is not None]
    empty = not xs
    desc = "No data." if empty else (f"{len(curves)} curve{'s' if len(curves) != 1 else ''}, x from {fmt(min(xs))} "
                                     f"to {fmt(max(xs))}: " + "; ".join(name for name, _ in curves))
    parts = _open(chart_id, title, desc, empty=empty)
    _axes(parts, x_label=x_label, y_label=y_label)
    if empty:
        _empty(parts, note)
        parts.append("</svg>")
        return mark_safe("".join(parts))
    if percent and y_max is None:
        y_max = 100.0
    lo = min(ys) if y_min is None else min(y_min, min(ys))
    hi = max(ys) if y_max is None else max(y_max, max(ys))
    y = _y_scale(parts, lo, hi if hi > lo else lo + 1, percent=percent)
    bottom = HEIGHT - BOTTOM
    x_lo, x_hi = min(xs), max(xs)
    integer = all(float(v).is_integer() for v in xs)
    ticks = nice_ticks(x_lo, x_hi if x_hi > x_lo else x_lo + 1, 6, integer=integer)
    t0, t1 = ticks[0], ticks[-1]
    plot_w = WIDTH - RIGHT - LEFT - 8

    def x(value: float) -> float:
        return LEFT + 4 + (value - t0) / (t1 - t0) * plot_w

    for tick in ticks:
        parts.append(f'<text class="tick x-tick" x="{x(tick):.1f}" y="{bottom + 15}" text-anchor="middle" '
                     f'font-size="11" fill="#667">{_e(fmt(tick))}</text>')
    count = sum(1 for _, pts in curves for p in pts if p.get("y") is not None)
    radius = 3.0 if count <= 150 else 2.0
    for index, (name, pts) in enumerate(curves):
        color = color_of(index)
        segments: list[list[str]] = [[]]
        for p in pts:
            value = p.get("line", p.get("y"))
            if value is None:
                segments.append([])
                continue
            segments[-1].append(f"{x(p['x']):.1f},{y(value):.1f}")
        for segment in segments:
            if len(segment) > 1:
                parts.append(f'<polyline class="line" data-curve="{index}" points="{" ".join(segment)}" fill="none" '
                             f'stroke="{color}" stroke-width="2"/>')
        smoothed = any(p.get("line") is not None and p.get("line") != p.get("y") for p in pts)
        for p in pts:
            if p.get("y") is None:
                continue
            suffix = "%" if percent else ""
            label = p.get("label") or f"{name}: {fmt(p['y'])}{suffix} at {fmt(p['x'])}"
            mark = (f'<circle class="mark" cx="{x(p["x"]):.1f}" cy="{y(p["y"]):.1f}" r="{radius}" fill="{color}" '
                    f'{"fill-opacity=" + chr(34) + "0.45" + chr(34) + " " if smoothed else ""}'
                    f'data-value="{p["y"]}" data-x="{p["x"]}" data-curve="{index}"><title>{_e(label)}</title></circle>')
            if p.get("href"):
                mark = f'<a class="point-link" href="{_e(p["href"])}">{mark}</a>'
            parts.append(mark)
    parts.append("</svg>")
    return mark_safe("".join(parts))
