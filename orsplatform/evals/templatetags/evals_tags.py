from __future__ import annotations

from django import template

from orsplatform.evals.selectors import episode_for_session

register = template.Library()


@register.simple_tag
def agent_timeline(team, session: dict) -> dict | None:
    """For a session an evaluation drove, its trajectory with the AAP agent's side woven in: each
    agent turn (text, thinking, tool calls) followed by the ORS calls it made, matched by task id
    (calls the transcript does not name, if any, come last). None for other sessions."""
    episode = episode_for_session(team=team, sid=session["sid"]) if team is not None else None
    if episode is None:
        return None
    calls = {c["task_id"]: c for c in session["tool_calls"]}
    items, used = [], set()
    for entry in episode.transcript:
        call = calls.get(entry.get("task_id")) if entry.get("kind") == "tool" else None
        if call is not None:
            items.append({"call": call})
            used.add(call["task_id"])
        else:
            items.append({"entry": entry})
    return {"episode": episode, "items": items, "rest": [c for c in session["tool_calls"] if c["task_id"] not in used]}


@register.filter
def percent(value) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


@register.filter
def interval(pair, as_percent: bool = False) -> str:
    if not pair:
        return ""
    lo, hi = pair
    return f"[{lo * 100:.1f}, {hi * 100:.1f}] %" if as_percent else f"[{lo:.3f}, {hi:.3f}]"
