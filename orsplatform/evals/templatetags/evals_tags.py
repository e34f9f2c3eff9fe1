from __future__ import annotations

from django import template

from orsplatform.evals.selectors import episode_for_session

register = template.Library()


@register.inclusion_tag("evals/_transcript.html")
def agent_transcript(team, sid: str) -> dict:
    """The AAP agent's side of an evaluation episode (its text, thinking and tool calls with their
    results), for the session's trajectory page; nothing for sessions no evaluation drove."""
    episode = episode_for_session(team=team, sid=sid) if team is not None else None
    return {"episode": episode, "team": team}


@register.filter
def percent(value) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


@register.filter
def interval(pair, as_percent: bool = False) -> str:
    if not pair:
        return ""
    lo, hi = pair
    return f"[{lo * 100:.1f}, {hi * 100:.1f}] %" if as_percent else f"[{lo:.3f}, {hi:.3f}]"
