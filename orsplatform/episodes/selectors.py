from __future__ import annotations

from dataclasses import dataclass

from orsplatform.catalog.hidden import session_spec
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.auth import Caller


@dataclass(frozen=True)
class SessionRow:
    pk: int
    status: str
    version_id: int
    error: str
    runner: str


def session_get_for_caller(*, caller: Caller, sid: str) -> SessionRow | None:
    """None for an unknown session and for another team's session alike."""
    row = Session.objects.filter(sid=sid).values_list(
        "pk", "team_id", "status", "version_id", "error", "runner").first()
    if row is None or row[1] != caller.team_id:
        return None
    return SessionRow(pk=row[0], status=row[2], version_id=row[3], error=row[4], runner=row[5])


def session_sid_taken(*, sid: str) -> bool:
    return Session.objects.filter(sid=sid).exists()


def tool_call_result_get(*, session_pk: int, task_id: str) -> tuple[str, dict | None, str] | None:
    """(status, result, error) of a call of a session the caller owns."""
    return ToolCall.objects.filter(session_id=session_pk, task_id=task_id).values_list(
        "status", "output", "error").first()


def sessions_for_team(*, team_id: int, environment: str | None = None, status: str | None = None,
                      limit: int = 100, before_id: int | None = None):
    """The team's sessions, newest first (keyset pagination on id)."""
    qs = Session.objects.filter(team_id=team_id).select_related("environment__team", "version")
    if environment:
        team_slug, _, slug = environment.partition("/")
        qs = qs.filter(environment__team__slug=team_slug, environment__slug=slug) if slug else qs.filter(
            environment__slug=team_slug)
    if status:
        qs = qs.filter(status=status)
    if before_id is not None:
        qs = qs.filter(id__lt=before_id)
    return list(qs.order_by("-id")[:limit])


def session_detail_for_team(*, team_id: int, sid: str,
                            sealed_reader: int | None) -> tuple[Session, list[ToolCall]] | None:
    """The team's session as the caller may see it: a sealed split's task spec is None unless the
    caller reads that environment's sealed specs (catalog/hidden.py: `sealed_reader`). The row is
    for reading only."""
    session = Session.objects.filter(team_id=team_id, sid=sid).select_related("environment__team", "version").first()
    if session is None:
        return None
    session.task_spec = session_spec(session.task_spec, sealed=session.sealed,
                                     environment_team_id=session.environment.team_id, reader=sealed_reader)
    # From the database, and from the archive for days that left it (docs/audit-log.md).
    from orsplatform.auditlog.selectors import calls_of_sessions

    return session, calls_of_sessions([session]).get(session.pk, [])
