"""A package README as HTML that cannot run anything.

markdown-it-py renders CommonMark with raw HTML off (a <script> in the README comes out as text) and
refuses javascript:/vbscript:/data: links itself; nh3 (ammonia) then keeps only the tags and
attributes below, as a second wall in case a renderer bug lets markup through. READMEs are chosen
by tenants and shown to everyone who may see the environment, so both walls stay.
"""

from __future__ import annotations

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

MAX_README_CHARS = 200_000

_renderer = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable(
    ["table", "strikethrough"])

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
    "i", "img", "li", "ol", "p", "pre", "s", "strong", "sub", "sup", "table", "tbody", "td", "th", "thead",
    "tr", "ul",
}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "code": {"class"}}
# Table alignment, the only inline style markdown-it writes, becomes one of these classes: the
# Content-Security-Policy allows no inline styles.
ALIGN_CLASSES = {"align-left", "align-center", "align-right"}


def _align_as_class(tokens) -> None:
    for token in tokens:
        if token.type in ("th_open", "td_open") and token.attrs.get("style"):
            align = str(token.attrs.pop("style")).partition(":")[2].strip()
            if f"align-{align}" in ALIGN_CLASSES:
                token.attrs["class"] = f"align-{align}"


def render_markdown(text: str) -> SafeString:
    tokens = _renderer.parse(text[:MAX_README_CHARS])
    _align_as_class(tokens)
    html = _renderer.renderer.render(tokens, _renderer.options, {})
    clean = nh3.clean(
        html, tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, url_schemes={"http", "https", "mailto"},
        link_rel="nofollow noopener noreferrer",
        allowed_classes={"th": ALIGN_CLASSES, "td": ALIGN_CLASSES},
    )
    return mark_safe(clean)  # noqa: S308 — sanitized just above
