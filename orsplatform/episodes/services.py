from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from orsplatform.episodes.models import Session, ToolCall

ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)


def session_create(**row: Any) -> int:
    """Insert one episode row; raises IntegrityError when the sid is taken."""
    return sessions_create(rows=[row])[0]


def sessions_create(*, rows: list[dict[str, Any]]) -> list[int]:
    """Insert episode rows in one statement (the gateway group-commits concurrent /create calls).
    Each row: sid, caller, env, task_spec, split, index, runner."""
    now = timezone.now()
    sessions = [
        Session(
            sid=r["sid"], team_id=r["caller"].team_id, api_key_id=r["caller"].api_key_id,
            environment_id=r["env"].environment_id, version_id=r["env"].version_id, task_spec=r["task_spec"],
            split=r.get("split", ""), task_index=r.get("index"), status=Session.Status.CREATING,
            runner=r.get("runner", ""), created_at=now, last_activity_at=now,
        )
        for r in rows
    ]
    Session.objects.bulk_create(sessions)
    return [s.pk for s in sessions]


def session_mark_ready(*, pk: int, ready_at: datetime) -> None:
    Session.objects.filter(pk=pk, status=Session.Status.CREATING).update(
        status=Session.Status.READY, ready_at=ready_at)
    Session.objects.filter(pk=pk, ready_at__isnull=True).update(ready_at=ready_at)


def session_mark_failed(*, pk: int, error: str) -> None:
    Session.objects.filter(pk=pk).exclude(status__in=ENDED).update(status=Session.Status.FAILED, error=error[:4000])


def session_end(**row: Any) -> None:
    """Close an episode (see sessions_end)."""
    sessions_end(rows=[row])


_END_SQL = (
    "UPDATE episodes_session SET status = %s, ended_at = %s,"
    " last_activity_at = COALESCE(%s, last_activity_at), ready_at = COALESCE(%s, ready_at),"
    " calls = COALESCE(%s, calls), total_reward = CASE WHEN %s THEN %s ELSE total_reward END,"
    " finished = COALESCE(%s, finished)"
    " WHERE id = %s AND status NOT IN ('deleted', 'expired', 'lost')"
)


def sessions_end(*, rows: list[dict[str, Any]]) -> None:
    """Close episodes. Each row: pk, status, and optionally last_activity_at, ready_at and totals.
    The gateway keeps the running totals in memory and writes them here, so a tool call costs one
    insert; the audit rows remain what they can be recomputed from. One executemany of plain SQL:
    the ORM's per-row CASE expressions cost more CPU than the whole rest of an episode."""
    now = timezone.now()
    params = []
    for r in rows:
        totals: SessionTotals | None = r.get("totals")
        params.append((
            r["status"], now, r.get("last_activity_at"), r.get("ready_at"),
            totals.calls if totals else None, totals is not None, totals.total_reward if totals else None,
            totals.finished if totals else None, r["pk"],
        ))
    with connection.cursor() as cursor:
        cursor.executemany(_END_SQL, params)


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


def tool_call_record(**row: Any) -> None:
    """Write one finished call to the audit log (see tool_calls_record)."""
    tool_calls_record(rows=[row])


def tool_calls_record(*, rows: list[dict[str, Any]]) -> None:
    """Write finished calls to the audit log in one statement. Each row: session_pk, task_id,
    name, input, result (the wire result or None), exception, started_at, finished_at."""
    calls = []
    for r in rows:
        result = r["result"]
        ok = bool(result and result.get("ok"))
        output = (result or {}).get("output") or {}
        error = r["exception"] or ("" if ok else (result or {}).get("error", ""))
        calls.append(ToolCall(
            session_id=r["session_pk"], task_id=r["task_id"], name=r["name"][:200], input=r["input"], output=result,
            status=ToolCall.Status.OK if ok else ToolCall.Status.ERROR,
            reward=output.get("reward") if ok else None, finished=bool(output.get("finished")) if ok else False,
            error=error[:4000], started_at=r["started_at"], finished_at=r["finished_at"],
        ))
    ToolCall.objects.bulk_create(calls)
