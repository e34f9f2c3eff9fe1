from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from orsplatform.catalog.selectors import EnvHandle
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.auth import Caller

ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)


def session_create(*, sid: str, caller: Caller, env: EnvHandle, task_spec: Any, split: str = "",
                   index: int | None = None, runner: str = "") -> int:
    """Insert the episode row; raises IntegrityError when the sid is taken."""
    now = timezone.now()
    session = Session.objects.create(
        sid=sid, team_id=caller.team_id, api_key_id=caller.api_key_id, environment_id=env.environment_id,
        version_id=env.version_id, task_spec=task_spec, split=split, task_index=index,
        status=Session.Status.CREATING, runner=runner, created_at=now, last_activity_at=now,
    )
    return session.pk


def session_mark_ready(*, pk: int, ready_at: datetime) -> None:
    Session.objects.filter(pk=pk, status=Session.Status.CREATING).update(
        status=Session.Status.READY, ready_at=ready_at)
    Session.objects.filter(pk=pk, ready_at__isnull=True).update(ready_at=ready_at)


def session_mark_failed(*, pk: int, error: str) -> None:
    Session.objects.filter(pk=pk).exclude(status__in=ENDED).update(status=Session.Status.FAILED, error=error[:4000])


def session_end(*, pk: int, status: str, last_activity_at: datetime | None = None,
                totals: SessionTotals | None = None, ready_at: datetime | None = None) -> None:
    """Close an episode. The gateway keeps the running totals in memory and writes them here, so
    a tool call costs one insert; the audit rows remain the source they can be recomputed from."""
    updates: dict[str, Any] = {"status": status, "ended_at": timezone.now()}
    if last_activity_at is not None:
        updates["last_activity_at"] = last_activity_at
    if totals is not None:
        updates.update(calls=totals.calls, total_reward=totals.total_reward, finished=totals.finished)
    if ready_at is not None:
        updates["ready_at"] = ready_at
    Session.objects.filter(pk=pk).exclude(status__in=ENDED).update(**updates)


def sessions_touch(*, activity: dict[int, tuple[datetime, datetime | None]]) -> None:
    """Write coalesced activity times and readiness (pings never write one by one)."""
    for pk, (last_activity_at, ready_at) in activity.items():
        Session.objects.filter(pk=pk).update(last_activity_at=last_activity_at)
        if ready_at is not None:
            session_mark_ready(pk=pk, ready_at=ready_at)


@dataclass(frozen=True)
class SessionTotals:
    calls: int
    total_reward: float | None
    finished: bool


def tool_call_record(*, session_pk: int, task_id: str, name: str, input: Any, result: dict | None,
                     exception: str | None, started_at: datetime, finished_at: datetime) -> None:
    """Write a finished call to the audit log."""
    ok = bool(result and result.get("ok"))
    output = (result or {}).get("output") or {}
    error = exception or ("" if ok else (result or {}).get("error", ""))
    ToolCall.objects.create(
        session_id=session_pk, task_id=task_id, name=name[:200], input=input, output=result,
        status=ToolCall.Status.OK if ok else ToolCall.Status.ERROR,
        reward=output.get("reward") if ok else None, finished=bool(output.get("finished")) if ok else False,
        error=error[:4000], started_at=started_at, finished_at=finished_at,
    )
