"""The session explorer's reads (a team's sessions, page by page, and one session's trajectory),
apart from the analytics pages' aggregates in selectors.py. A trajectory's calls come from the
database and, for days that left it, from the archive (docs/audit-log.md)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, F, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from orsplatform.analytics.filters import SessionFilters, outcome_of, sort_order
from orsplatform.analytics.selectors import OPEN
from orsplatform.auditlog.selectors import calls_of_sessions, session_archived
from orsplatform.catalog.hidden import session_spec
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team

PER_PAGE = 50
MAX_TRAJECTORY_CALLS = 500


def _open_totals(session_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Calls and reward of open sessions, whose Session row is only written when they end."""
    if not session_ids:
        return {}
    return {r["session_id"]: r for r in ToolCall.objects.filter(session_id__in=session_ids).values("session_id")
            .annotate(calls=Count("id"), total_reward=Sum("reward")).order_by()}


def session_row(session: Session, live: dict[str, Any] | None = None) -> dict[str, Any]:
    is_open = session.status in OPEN
    end = session.ended_at or (timezone.now() if is_open else session.last_activity_at)
    return {
        "sid": session.sid,
        "environment": session.environment.full_name,
        "version": session.version.number,
        "api_key": ({"name": session.api_key.name, "prefix": session.api_key.prefix} if session.api_key_id else None),
        "protocol": session.protocol,
        "status": session.status,
        "outcome": outcome_of(session.status, session.finished),
        "split": session.split,
        "task_index": session.task_index,
        "sealed": session.sealed,
        "created_at": session.created_at,
        "ended_at": session.ended_at,
        "duration_s": max(0.0, (end - session.created_at).total_seconds()) if end else None,
        "calls": (live or {}).get("calls", 0) if is_open else session.calls,
        "total_reward": (live or {}).get("total_reward") if is_open else session.total_reward,
        "finished": session.finished,
        "open": is_open,
    }


def sessions_page(*, team: Team, filters: SessionFilters, page: int, per_page: int = PER_PAGE,
                  sort: str = "-started", sealed_reader: int | None = None) -> dict[str, Any]:
    qs = filters.apply(Session.objects.filter(team=team), sealed_reader=sealed_reader)
    paginator = Paginator(qs.order_by("-created_at"), per_page)  # counted without the sort's joins
    total = paginator.count
    pages = paginator.num_pages
    if page > pages:
        raise ValidationError(f"Page {page:,} is past the last page ({pages:,}) of these {total:,} sessions.")
    ordered = (qs.select_related("environment__team", "version", "api_key").defer("task_spec", "prompt", "error")
               .annotate(duration=Coalesce("ended_at", "last_activity_at") - F("created_at"))
               .order_by(*sort_order(sort)))
    rows = list(ordered[(page - 1) * per_page: page * per_page])
    live = _open_totals([s.pk for s in rows if s.status in OPEN])
    return {"total": total, "page": page, "pages": pages, "per_page": per_page, "sort": sort,
            "sessions": [session_row(s, live.get(s.pk)) for s in rows]}


def _blocks(value: Any) -> list[dict[str, Any]]:
    return [b for b in value if isinstance(b, dict)] if isinstance(value, list) else []


def call_row(call: ToolCall, step: int) -> dict[str, Any]:
    result = call.output if isinstance(call.output, dict) else {}
    output = result.get("output") if isinstance(result.get("output"), dict) else {}
    return {
        "step": step,
        "task_id": call.task_id,
        "name": call.name,
        "input": call.input,
        "status": call.status,
        "ok": bool(result.get("ok")),
        "blocks": _blocks(output.get("blocks")),
        "metadata": output.get("metadata"),
        "reward": call.reward,
        "finished": call.finished,
        "error": call.error or (result.get("error") if not result.get("ok") else "") or "",
        "reason": result.get("reason") if not result.get("ok") else None,
        "started_at": call.started_at,
        "finished_at": call.finished_at,
        "latency_ms": ((call.finished_at - call.started_at).total_seconds() * 1000) if call.finished_at else None,
        "archived": getattr(call, "archived", False),  # read back from the archive (docs/audit-log.md)
    }


def session_trajectory(*, team: Team, sid: str, sealed_reader: int | None = None) -> dict[str, Any] | None:
    """One session of the team with its prompt and calls; None for a missing or another team's sid.
    A sealed split's task spec is None unless the viewer reads the environment's sealed specs
    (catalog/hidden.py: `sealed_reader`)."""
    session = (Session.objects.filter(team=team, sid=sid).select_related("environment__team", "version", "api_key")
               .first())
    if session is None:
        return None
    if session_archived(session):  # days of its calls left the database: the archive has them
        every = calls_of_sessions([session]).get(session.pk, [])
        calls, total_calls = every[:MAX_TRAJECTORY_CALLS], len(every)
    else:
        calls = list(session.tool_calls.order_by("started_at", "id")[:MAX_TRAJECTORY_CALLS + 1])
        total_calls = session.tool_calls.count() if len(calls) > MAX_TRAJECTORY_CALLS else len(calls)
        calls = calls[:MAX_TRAJECTORY_CALLS]
    live = _open_totals([session.pk]).get(session.pk) if session.status in OPEN else None
    return {
        **session_row(session, live),
        "task_spec": session_spec(session.task_spec, sealed=session.sealed,
                                  environment_team_id=session.environment.team_id, reader=sealed_reader),
        "prompt": _blocks(session.prompt) if session.prompt is not None else None,
        "error": session.error,
        "total_calls": total_calls,
        "calls_shown": len(calls),
        "archived": any(getattr(c, "archived", False) for c in calls),
        "tool_calls": [call_row(c, i + 1) for i, c in enumerate(calls)],
    }
