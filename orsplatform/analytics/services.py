"""Writes of the analytics app: folding the tool-call audit log into the rollup tables."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from orsplatform.analytics import latency
from orsplatform.analytics.models import TOOL_CALLS_CURSOR, CallRollup, LatencyRollup, RollupCursor
from orsplatform.celery import task
from orsplatform.episodes.models import Session, ToolCall

log = logging.getLogger(__name__)

CURSOR_NAME = TOOL_CALLS_CURSOR
DEFAULT_BATCH = 20_000
# SQLite refuses statements with more than 32,766 parameters; stay far below it.
_IN_CHUNK = 900


def settle_seconds() -> float:
    """How long a newly seen id waits before it is folded (see tool_call_rollup_advance). SQLite
    lets one writer in at a time, so there ids commit in order and nothing needs to settle."""
    configured = getattr(settings, "ORS_ANALYTICS_SETTLE_SECONDS", None)
    if configured is not None:
        return float(configured)
    return 0.0 if connection.vendor == "sqlite" else 10.0


@dataclass(frozen=True)
class RollupProgress:
    folded: int  # audit rows folded by this call
    last_id: int  # every ToolCall id at or below this is in the rollups
    caught_up: bool  # nothing settled is left to fold


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _day(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def _session_dims(session_ids: set[int]) -> dict[int, tuple[int, int, int, int]]:
    dims: dict[int, tuple[int, int, int, int]] = {}
    ids = sorted(session_ids)
    for i in range(0, len(ids), _IN_CHUNK):
        for pk, team_id, env_id, version_id, key_id in Session.objects.filter(
                pk__in=ids[i:i + _IN_CHUNK], team_id__isnull=False).values_list(
                "pk", "team_id", "environment_id", "version_id", "api_key_id"):
            dims[pk] = (team_id, env_id, version_id, key_id or 0)
    return dims


def _fold(rows: list[tuple]) -> tuple[dict, dict]:
    """Aggregate audit rows (id, session_id, name, status, started_at, finished_at) into rollup deltas:
    {(team, env, version, key, name, hour): [calls, errors, timed, latency_sum]} and
    {(team, env, version, name, day, bucket): count}."""
    dims = _session_dims({r[1] for r in rows})
    calls: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0.0])
    buckets: dict[tuple, int] = defaultdict(int)
    for _id, session_id, name, status, started_at, finished_at in rows:
        dim = dims.get(session_id)
        if dim is None:  # an anonymous session (no team can see it) or one deleted meanwhile
            continue
        team_id, env_id, version_id, key_id = dim
        started_at = started_at.astimezone(UTC)
        entry = calls[(team_id, env_id, version_id, key_id, name, _hour(started_at))]
        entry[0] += 1
        if status == ToolCall.Status.ERROR:
            entry[1] += 1
        if finished_at is not None:
            ms = max(0.0, (finished_at - started_at).total_seconds() * 1000)
            entry[2] += 1
            entry[3] += ms
            buckets[(team_id, env_id, version_id, name, _day(started_at), latency.bucket_of(ms))] += 1
    return calls, buckets


def _upsert_adding(model, keys: tuple[str, ...], measures: tuple[str, ...], rows: list[tuple]) -> None:
    """INSERT rows, adding the measures to those of an existing row with the same key: one
    statement per chunk, the same SQL on PostgreSQL and SQLite (3.24+). Django's own upsert
    (bulk_create update_conflicts) can only overwrite a value, not add to it."""
    if not rows:
        return
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = [model._meta.get_field(name).column for name in (*keys, *measures)]
    datetime_columns = {i for i, name in enumerate((*keys, *measures))
                        if model._meta.get_field(name).get_internal_type() == "DateTimeField"}
    per_row = len(columns)
    chunk = max(1, (connection.features.max_query_params or 10_000) // per_row)
    updates = ", ".join(f"{qn(c)} = {table}.{qn(c)} + excluded.{qn(c)}" for c in columns[len(keys):])
    conflict = ", ".join(qn(c) for c in columns[:len(keys)])
    with connection.cursor() as cursor:
        for i in range(0, len(rows), chunk):
            part = rows[i:i + chunk]
            params: list = []
            for row in part:
                params.extend(connection.ops.adapt_datetimefield_value(v) if j in datetime_columns else v
                              for j, v in enumerate(row))
            placeholders = ", ".join(["(" + ", ".join(["%s"] * per_row) + ")"] * len(part))
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) VALUES {placeholders}"
                f" ON CONFLICT ({conflict}) DO UPDATE SET {updates}", params)


def _write(calls: dict[tuple, list], buckets: dict[tuple, int]) -> None:
    _upsert_adding(CallRollup, ("team", "environment", "version", "api_key_ref", "name", "hour"),
                   ("calls", "errors", "timed_calls", "latency_ms_sum"),
                   [(*key, *values) for key, values in calls.items()])
    _upsert_adding(LatencyRollup, ("team", "environment", "version", "name", "day", "bucket"), ("count",),
                   [(*key, count) for key, count in buckets.items()])


def _lock_cursor() -> RollupCursor | None:
    RollupCursor.objects.get_or_create(name=CURSOR_NAME)
    qs = RollupCursor.objects.filter(name=CURSOR_NAME)
    # Two workers (beat plus a page's nudge) must never fold the same rows twice: the cursor row is
    # the lock. On Postgres a second worker skips instead of queueing behind the first; SQLite
    # serialises writers anyway (transaction_mode IMMEDIATE).
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True)
    return qs.first()


def tool_call_rollup_advance(*, batch_size: int = DEFAULT_BATCH, settle: float | None = None) -> RollupProgress:
    """Fold the next batch of settled audit rows into the rollups, atomically with the cursor.

    Ids are handed out when an INSERT starts but become visible when it commits, so a call with a
    lower id can appear after one with a higher id. Folding "everything above last_id" the moment it
    is seen would skip such a row forever. So each run records the highest id it sees, and rows are
    folded only up to an id that was seen at least `settle` seconds ago — by then every insert that
    drew a lower id has committed (the hot path's inserts are single short statements). Tests pass
    settle=0 to fold everything at once.
    """
    settle = settle_seconds() if settle is None else settle
    with transaction.atomic():
        cursor = _lock_cursor()
        if cursor is None:
            return RollupProgress(folded=0, last_id=0, caught_up=False)  # another worker is folding
        now = timezone.now()
        if settle <= 0:
            cursor.seen_max_id = ToolCall.objects.aggregate(m=Max("id"))["m"] or 0
            cursor.seen_at = now
            safe_id = cursor.seen_max_id
        elif cursor.seen_at is not None and now - cursor.seen_at >= timedelta(seconds=settle):
            safe_id = cursor.seen_max_id
        else:
            safe_id = cursor.last_id
        rows = list(
            ToolCall.objects.filter(id__gt=cursor.last_id, id__lte=safe_id).order_by("id")
            .values_list("id", "session_id", "name", "status", "started_at", "finished_at")[:batch_size]
        )
        _write(*_fold(rows))
        cursor.last_id = rows[-1][0] if len(rows) == batch_size else max(cursor.last_id, safe_id)
        caught_up = cursor.last_id >= safe_id
        if caught_up and (cursor.seen_at is None or settle <= 0 or now - cursor.seen_at >= timedelta(seconds=settle)):
            # Take the next observation only once the previous one is fully folded, so an observation
            # always marks a point that has had time to settle.
            cursor.seen_max_id = max(cursor.seen_max_id, ToolCall.objects.aggregate(m=Max("id"))["m"] or 0)
            cursor.seen_at = now
        cursor.last_run_at = now
        cursor.save()
    if rows:
        log.info("analytics rollup folded %d tool calls up to id %d", len(rows), cursor.last_id)
    return RollupProgress(folded=len(rows), last_id=cursor.last_id, caught_up=caught_up)


def tool_call_rollup_run(*, max_batches: int = 1_000_000, batch_size: int = DEFAULT_BATCH,
                         settle: float | None = None) -> int:
    """Fold batches until caught up or max_batches is reached; returns the rows folded."""
    folded = 0
    for _ in range(max_batches):
        progress = tool_call_rollup_advance(batch_size=batch_size, settle=settle)
        folded += progress.folded
        if progress.folded == 0 or progress.caught_up:
            break
    return folded


def tool_call_rollup_rebuild() -> None:
    """Forget the rollups so the next runs fold the whole audit log again (after a bug fix, say)."""
    with transaction.atomic():
        CallRollup.objects.all().delete()
        LatencyRollup.objects.all().delete()
        RollupCursor.objects.filter(name=CURSOR_NAME).delete()


def rollup_nudge() -> None:
    """Ask the worker for a rollup run when a page finds the rollup behind (a few batches, no
    re-queue): beat runs it every 30 s anyway, but a fresh install's pages fill in as they are viewed."""
    cursor = RollupCursor.objects.filter(name=CURSOR_NAME).values_list("last_id", "last_run_at").first()
    last_id, last_run_at = cursor or (0, None)
    if last_run_at is not None and timezone.now() - last_run_at < timedelta(seconds=max(5.0, settle_seconds())):
        return
    if not ToolCall.objects.filter(id__gt=last_id).exists():
        return
    def enqueue() -> None:
        # A page must not fail, nor wait on broker retries, because a nudge could not be sent: beat
        # runs the rollup anyway.
        try:
            task("analytics.rollup_tool_calls").apply_async(kwargs={"max_batches": 3, "requeue": False},
                                                           retry=False)
        except Exception:  # noqa: BLE001 - any broker failure
            log.warning("analytics rollup nudge failed", exc_info=True)

    transaction.on_commit(enqueue)
