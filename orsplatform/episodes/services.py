from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from orsplatform.episodes.models import Session, ToolCall

ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)


def session_create(**row: Any) -> int:
    """Insert one episode row; raises IntegrityError when the sid is taken."""
    return sessions_create(rows=[row])[0]


def session_fields(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The columns of a new episode row (shared by the ORM path and the gateway's PostgreSQL writer)."""
    return {
        "sid": row["sid"], "team_id": row["caller"].team_id, "api_key_id": row["caller"].api_key_id,
        "environment_id": row["env"].environment_id, "version_id": row["env"].version_id,
        "task_spec": row["task_spec"], "split": row.get("split", ""), "task_index": row.get("index"),
        "status": Session.Status.CREATING.value, "runner": row.get("runner", ""), "error": "",
        "created_at": now, "last_activity_at": now, "calls": 0, "finished": False,
        "protocol": row.get("protocol", Session.Protocol.ORS.value), "sealed": row.get("sealed", False),
        "run_name": row.get("run_name", ""),
    }


def sessions_create(*, rows: list[dict[str, Any]]) -> list[int]:
    """Insert episode rows in one statement (the gateway group-commits concurrent /create calls).
    Each row: sid, caller, env, task_spec, split, index, runner, protocol."""
    now = timezone.now()
    sessions = [Session(**session_fields(r, now)) for r in rows]
    Session.objects.bulk_create(sessions)
    return [s.pk for s in sessions]


def session_mark_ready(*, pk: int, ready_at: datetime) -> None:
    Session.objects.filter(pk=pk, status=Session.Status.CREATING).update(
        status=Session.Status.READY, ready_at=ready_at)
    Session.objects.filter(pk=pk, ready_at__isnull=True).update(ready_at=ready_at)


def session_mark_failed(*, pk: int, error: str) -> None:
    Session.objects.filter(pk=pk).exclude(status__in=ENDED).update(status=Session.Status.FAILED, error=error[:4000])


def session_discard(*, pk: int) -> None:
    """Remove a session whose runner never received it (so the client may retry the same id)."""
    Session.objects.filter(pk=pk, calls=0).delete()


def session_end(**row: Any) -> None:
    """Close an episode (see sessions_end)."""
    sessions_end(rows=[row])


# Totals not passed (NULL) are summed from the audit log: sessions served by several gateways (the
# celery executor) have no in-memory totals. COALESCE and CASE evaluate the subquery only then.
# On PostgreSQL the calls are bounded by the session's creation (an hour early, for gateways'
# clocks): calls start after it, and the bound lets the audit log's earlier days' partitions go
# unread.
_END_SQL = (
    "UPDATE episodes_session SET status = %s, ended_at = %s,"
    " last_activity_at = COALESCE(%s, last_activity_at), ready_at = COALESCE(%s, ready_at),"
    " calls = COALESCE(%s, (SELECT COUNT(*) {calls})),"
    " total_reward = CASE WHEN %s THEN %s ELSE (SELECT SUM(reward) {calls}) END,"
    " finished = COALESCE(%s, EXISTS(SELECT 1 {calls} AND t.finished)),"
    " prompt = COALESCE(prompt, %s)"
    " WHERE id = %s AND status NOT IN ('deleted', 'expired', 'lost')"
)
_CALLS_OF = "FROM episodes_toolcall t WHERE t.session_id = episodes_session.id"
END_SQL = _END_SQL.format(calls=_CALLS_OF)
END_SQL_POSTGRESQL = _END_SQL.format(
    calls=f"{_CALLS_OF} AND t.started_at >= episodes_session.created_at - INTERVAL '1 hour'")


def end_sql() -> str:
    return END_SQL_POSTGRESQL if connection.vendor == "postgresql" else END_SQL


def sessions_end(*, rows: list[dict[str, Any]]) -> None:
    """Close episodes. Each row: pk, status, and optionally last_activity_at, ready_at and totals.
    The gateway keeps the running totals in memory and writes them here, so a tool call costs one
    insert; the audit rows remain what they can be recomputed from. One executemany of plain SQL:
    the ORM's per-row CASE expressions cost more CPU than the whole rest of an episode. Sessions
    served by several gateways (the celery executor) have no in-memory totals: the audit log is
    summed instead, in the same statement (an index lookup on the session's calls). A row's
    optional ``prompt`` (blocks) is stored unless one already is: a gateway that holds the
    session to its end writes the prompt here instead of in a statement of its own."""
    with connection.cursor() as cursor:
        cursor.executemany(end_sql(), session_end_params(rows, _json_param))


def _json_param(value: Any) -> Any:
    """A JSON value as the prompt column takes it through Django's connection."""
    return Session._meta.get_field("prompt").get_db_prep_value(value, connection)


TOUCH_SQL = "UPDATE episodes_session SET last_activity_at = CASE id {cases} END WHERE id IN ({ids})"
READY_SQL = "UPDATE episodes_session SET status = %s, ready_at = %s WHERE id = %s AND status = %s"
READY_AT_SQL = "UPDATE episodes_session SET ready_at = %s WHERE id = %s AND ready_at IS NULL"


def sessions_touch(*, activity: dict[int, tuple[datetime, datetime | None]]) -> None:
    """Write coalesced activity times and readiness (pings never write one by one). One
    executemany of plain SQL: with thousands of open sessions, an ORM update each held the
    database (SQLite's one writer) for seconds, and every episode's writes queued behind it."""
    with connection.cursor() as cursor:
        adapt = connection.ops.adapt_datetimefield_value  # the column's own form on each database
        # One statement for them all (the gateway writes a slice of a few hundred at a time): an
        # executemany runs a statement per row, and on SQLite each of them gives up the GIL and
        # waits to take it back from a busy event loop (up to 5 ms: 256 rows took 0.1-0.5 s).
        if activity:
            cases = " ".join(["WHEN %s THEN %s"] * len(activity))
            ids = ", ".join(["%s"] * len(activity))
            params: list = [v for pk, (at, _) in activity.items() for v in (pk, adapt(at))]
            cursor.execute(TOUCH_SQL.format(cases=cases, ids=ids), [*params, *activity])
        # Readiness as session_mark_ready, for all of them in two statements: two ORM updates per
        # session held the one SQLite writer (and, on its thread, the GIL) for seconds when
        # 2,000 sessions opened within one flush interval.
        ready = [(adapt(ready_at), pk) for pk, (_, ready_at) in activity.items() if ready_at is not None]
        if ready:
            cursor.executemany(READY_SQL, [(Session.Status.READY.value, at, pk, Session.Status.CREATING.value)
                                           for at, pk in ready])
            cursor.executemany(READY_AT_SQL, ready)


@dataclass(frozen=True)
class SessionTotals:
    calls: int
    total_reward: float | None
    finished: bool


def tool_call_record(**row: Any) -> None:
    """Write one finished call to the audit log (see tool_calls_record)."""
    tool_calls_record(rows=[row])


TOOL_CALL_RESULT_FIELDS = ["output", "status", "reward", "finished", "error", "finished_at"]
# The statuses' text read once: an enum member's .value costs a descriptor call, for every audit row.
_CALL_OK, _CALL_ERROR = ToolCall.Status.OK.value, ToolCall.Status.ERROR.value


def tool_call_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The columns of a finished call's audit row, from the gateway's record of it."""
    result = row["result"]
    ok = bool(result and result.get("ok"))
    output = (result or {}).get("output") or {}
    error = row["exception"] or ("" if ok else (result or {}).get("error", ""))
    return {
        "session_id": row["session_pk"], "task_id": row["task_id"], "name": row["name"][:200],
        "input": row["input"], "output": result,
        "status": _CALL_OK if ok else _CALL_ERROR,
        "reward": output.get("reward") if ok else None, "finished": bool(output.get("finished")) if ok else False,
        "error": error[:4000], "started_at": row["started_at"], "finished_at": row["finished_at"],
    }


def tool_calls_record(*, rows: list[dict[str, Any]]) -> None:
    """Write finished calls to the audit log in one statement. Each row: session_pk, task_id,
    name, input, result (the wire result or None), exception, started_at, finished_at."""
    # An upsert on the call's key: the gateway and the orphaned-call sweeper may both record a call
    # (with the same started_at, the partition key on PostgreSQL).
    ToolCall.objects.bulk_create(
        [ToolCall(**tool_call_fields(r)) for r in rows], update_conflicts=True,
        unique_fields=["task_id", "started_at"],
        update_fields=TOOL_CALL_RESULT_FIELDS,
    )


def session_end_params(rows: list[dict[str, Any]], json: Callable[[Any], Any]) -> list[tuple]:
    """Parameters for END_SQL; `json` wraps a JSON value for the connection that runs it."""
    now = timezone.now()
    params = []
    for r in rows:
        totals: SessionTotals | None = r.get("totals")
        params.append((
            r["status"], now, r.get("last_activity_at"), r.get("ready_at"),
            totals.calls if totals else None, totals is not None, totals.total_reward if totals else None,
            totals.finished if totals else None,
            None if r.get("prompt") is None else json(r["prompt"]), r["pk"],
        ))
    return params


PROMPT_SQL = "UPDATE episodes_session SET prompt = %s WHERE id = %s AND prompt IS NULL"


def session_record_prompt(*, pk: int, blocks: list[dict[str, Any]]) -> None:
    """Keep the prompt blocks of an episode for the session explorer and training-data exports.
    Only the first prompt is stored: clients may ask again (reconnects, retries) and the prompt of a
    task does not change within an episode, so later calls cost a no-op UPDATE, not a rewrite of
    a possibly large image payload."""
    Session.objects.filter(pk=pk, prompt__isnull=True).update(prompt=blocks)


def sessions_record_prompt(*, rows: list[dict[str, Any]]) -> None:
    """session_record_prompt for many sessions in one executemany (the ORM's update per row cost
    more than the episode's other writes together)."""
    with connection.cursor() as cursor:
        cursor.executemany(PROMPT_SQL, [(_json_param(r["blocks"]), r["pk"]) for r in rows])


# --- reaping (the celery executor's beat tasks) ---------------------------------------------------

OPEN = (Session.Status.CREATING, Session.Status.READY)


def sessions_expire_idle(*, idle_before: datetime, limit: int) -> list[tuple[str, str, int]]:
    """Mark up to `limit` open sessions idle since before `idle_before` as expired; returns their
    (sid, runner, team id) so the caller can tear them down and free their slots. Safe with two
    beats: rows another worker has locked are skipped, and the update re-checks the status."""
    with transaction.atomic():
        rows = list(
            Session.objects.select_for_update(skip_locked=True)
            .filter(status__in=OPEN, last_activity_at__lt=idle_before).exclude(runner="inline")
            .order_by("last_activity_at").values_list("pk", "sid", "runner", "team_id")[:limit]
        )
        if rows:
            Session.objects.filter(pk__in=[r[0] for r in rows], status__in=OPEN).update(
                status=Session.Status.EXPIRED, ended_at=timezone.now())
    return [(sid, runner, team_id) for _, sid, runner, team_id in rows]


def open_session_runners() -> list[str]:
    return list(Session.objects.filter(status__in=OPEN).exclude(runner__in=["", "inline"])
                .values_list("runner", flat=True).distinct())


def sessions_open_on(*, runner: str) -> bool:
    return Session.objects.filter(runner=runner, status__in=OPEN).exists()


def sessions_mark_lost(*, runner: str, limit: int) -> list[tuple[str, int]]:
    """A runner's heartbeat stopped: its open sessions are lost and their running calls end with an
    error. Returns the (sid, team id) of those marked (a full batch means: call again)."""
    now = timezone.now()
    with transaction.atomic():
        rows = list(Session.objects.select_for_update(skip_locked=True)
                    .filter(runner=runner, status__in=OPEN).values_list("pk", "sid", "team_id")[:limit])
        pks = [pk for pk, _, _ in rows]
        if pks:
            Session.objects.filter(pk__in=pks, status__in=OPEN).update(
                status=Session.Status.LOST, ended_at=now, error=f"Runner {runner} stopped.")
            ToolCall.objects.filter(session_id__in=pks, status=ToolCall.Status.RUNNING).update(
                status=ToolCall.Status.ERROR, error="Runner lost: the node holding this session stopped.",
                finished_at=now)
    return [(sid, team_id) for _, sid, team_id in rows]


def tool_call_exists(*, task_id: str, started_at: datetime | None = None) -> bool:
    """Is the call recorded? With its start time, one day's partition is looked at, not all."""
    calls = ToolCall.objects.filter(task_id=task_id)
    return (calls.filter(started_at=started_at) if started_at is not None else calls).exists()


