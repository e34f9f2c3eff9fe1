"""Formatting for the analytics templates."""

from __future__ import annotations

import json
import re

from django import template

from orsplatform.analytics.charts import fmt

register = template.Library()

# Only raster types: an SVG "image" from a tenant could carry script if opened on its own.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]+$")
MAX_JSON_CHARS = 20_000


@register.filter
def num(value) -> str:
    return fmt(value)


@register.filter
def pct(value) -> str:
    """A ratio (0–1) as a percentage."""
    return "–" if value is None else f"{value * 100:.1f}%"


def duration_text(seconds: float | None) -> str:
    """A duration a person reads at a glance, in the unit that suits it: never "0.0 s" for a fast call,
    never "4521.3 s" for a long session. Under a second in ms ("< 1 ms" for a nonzero sliver), seconds
    with two significant decimals up to 10 s, then whole minutes and seconds, then hours and minutes."""
    if seconds is None or seconds != seconds or seconds < 0:  # None, NaN, or a clock that stepped back
        return "–"
    if seconds == 0:
        return "0 ms"
    if seconds < 0.001:
        return "< 1 ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms".replace(".0 ms", " ms")
    if round(seconds * 1000) < 1000:
        return f"{round(seconds * 1000)} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if round(seconds) < 60:
        return f"{seconds:.1f} s" if seconds < 59.95 else "1 min 0 s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60:,} h {minutes % 60} min"


@register.filter
def ms(value) -> str:
    """Milliseconds (latencies): as they are under a second, as a duration above."""
    if value is None:
        return "–"
    if value >= 1000:
        return duration_text(value / 1000)
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms".replace(".0 ms", " ms")


@register.filter
def seconds(value) -> str:
    """Seconds (session and episode durations) in the unit that suits them (duration_text)."""
    return duration_text(value)


@register.filter
def pretty_json(value) -> str:
    """Indented JSON (escaped by the template as usual), cut short for very large values."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)
    if len(text) > MAX_JSON_CHARS:
        return text[:MAX_JSON_CHARS] + f"\n… ({len(text) - MAX_JSON_CHARS:,} more characters; export the session for all)"
    return text


@register.filter
def image_src(block) -> str:
    """A data: URL for an image block, or "" when the block is not a safe raster image."""
    if not isinstance(block, dict):
        return ""
    mime = block.get("mimeType") or block.get("mime_type") or ""
    data = block.get("data") or ""
    if mime not in IMAGE_TYPES or not isinstance(data, str) or not BASE64.match(data):
        return ""
    return f"data:{mime};base64,{data}"


@register.filter
def get(mapping, key):
    return mapping.get(key) if isinstance(mapping, dict) else None
