from __future__ import annotations

from dataclasses import dataclass

from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.auth import Caller


@dataclass(frozen=True)
class SessionRow:
    pk: int
    status: str
    version_id: int
    error: str


def session_get_for_caller(*, caller: Caller, sid: str) -> SessionRow | None:
    """None for an unknown session and for another team's session alike."""
    row = Session.objects.filter(sid=sid).values_list("pk", "team_id", "status", "version_id", "error").first()
    if row is None or row[1] != caller.team_id:
        return None
    return SessionRow(pk=row[0], status=row[2], version_id=row[3], error=row[4])


def session_sid_taken(*, sid: str) -> bool:
    return Session.objects.filter(sid=sid).exists()


def tool_call_result_get(*, session_pk: int, task_id: str) -> tuple[str, dict | None, str] | None:
    """(status, result, error) of a call of a session the caller owns."""
    return ToolCall.objects.filter(session_id=session_pk, task_id=task_id).values_list(
        "status", "output", "error").first()
