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


@register.filter
def ms(value) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms".replace(".0 ms", " ms")


@register.filter
def seconds(value) -> str:
    if value is None:
        return "–"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


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
