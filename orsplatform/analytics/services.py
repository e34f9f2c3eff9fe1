"""Writes of the analytics app: folding the tool-call audit log into the rollup tables."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Max, Min
from django.utils import timezone

from orsplatform.analytics import latency, session_buckets
from orsplatform.analytics.models import (
    SESSIONS_CURSOR,
    TOOL_CALLS_CURSOR,
    CallRollup,
    LatencyRollup,
    RollupCursor,
    SessionBucketRollup,
    SessionRollup,
    TaskRollup,
)
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


def _upsert_adding(model, keys: tuple[str, ...], measures: tuple[str, ...], rows: list[tuple],
                   combine: dict[str, str] | None = None) -> None:
    """INSERT rows, adding the measures to those of an existing row with the same key (or keeping
    the lesser / greater, for the measures `combine` names "min" / "max"): one statement per chunk,
    the same SQL on PostgreSQL and SQLite (3.24+). Django's own upsert (bulk_create
    update_conflicts) can only overwrite a value, not add to it."""
    if not rows:
        return
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = [model._meta.get_field(name).column for name in (*keys, *measures)]
    datetime_columns = {i for i, name in enumerate((*keys, *measures))
                        if model._meta.get_field(name).get_internal_type() == "DateTimeField"}
    per_row = len(columns)
    chunk = max(1, (connection.features.max_query_params or 10_000) // per_row)
    updates = ", ".join(_combined(table, qn(c), (combine or {}).get(name, "add"))
                        for name, c in zip(measures, columns[len(keys):], strict=True))
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


def _combined(table: str, column: str, how: str) -> str:
    if how == "add":
        return f"{column} = {table}.{column} + excluded.{column}"
    # LEAST/GREATEST on PostgreSQL, the two-argument MIN/MAX on SQLite; a NULL (no reward yet) on
    # either side gives the other, on both.
    func = {"min": "LEAST", "max": "GREATEST"}[how] if connection.vendor == "postgresql" else how.upper()
    left, right = f"{table}.{column}", f"excluded.{column}"
    return f"{column} = {func}(COALESCE({left}, {right}), COALESCE({right}, {left}))"


def _write(calls: dict[tuple, list], buckets: dict[tuple, int]) -> None:
    _upsert_adding(CallRollup, ("team", "environment", "version", "api_key_ref", "name", "hour"),
                   ("calls", "errors", "timed_calls", "latency_ms_sum"),
                   [(*key, *values) for key, values in calls.items()])
    _upsert_adding(LatencyRollup, ("team", "environment", "version", "name", "day", "bucket"), ("count",),
                   [(*key, count) for key, count in buckets.items()])


def _lock_cursor(name: str = CURSOR_NAME) -> RollupCursor | None:
    RollupCursor.objects.get_or_create(name=name)
    qs = RollupCursor.objects.filter(name=name)
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


# --- sessions ---------------------------------------------------------------------------------------

DEFAULT_SESSION_BATCH = 5_000
ENDED = (Session.Status.DELETED, Session.Status.EXPIRED, Session.Status.LOST)
_SESSION_MEASURES = ("episodes", "scored", "passed", "reward_sum", "reward_sq_sum", "reward_min", "reward_max",
                     "calls_sum", "calls_max", "first_created_at", "last_created_at")
_SESSION_COMBINE = {"reward_min": "min", "reward_max": "max", "calls_max": "max", "first_created_at": "min",
                    "last_created_at": "max"}


def _pass_reward() -> float:
    return float(getattr(settings, "ORS_ANALYTICS_PASS_REWARD", 1.0))


def _fold_sessions(rows: list[tuple]) -> tuple[dict, dict, dict]:
    """Aggregate ended sessions (id, team, env, version, split, run, key, created_at, reward, calls,
    task_index) into deltas of SessionRollup, SessionBucketRollup and TaskRollup rows."""
    threshold = _pass_reward()
    sessions: dict[tuple, list] = {}
    buckets: dict[tuple, int] = defaultdict(int)
    tasks: dict[tuple, list] = defaultdict(lambda: [0, 0, 0.0])
    for _id, team_id, env_id, version_id, split, run, key_id, created_at, reward, calls, task_index in rows:
        created_at = created_at.astimezone(UTC)
        hour = _hour(created_at)
        key = (team_id, env_id, version_id, split, run, key_id or 0, hour)
        e = sessions.get(key)
        if e is None:
            e = sessions[key] = [0, 0, 0, 0.0, 0.0, None, None, 0, 0, created_at, created_at]
        e[0] += 1
        e[7] += calls
        e[8] = max(e[8], calls)
        e[9], e[10] = min(e[9], created_at), max(e[10], created_at)
        if reward is not None:
            passed = reward >= threshold
            e[1] += 1
            e[2] += passed
            e[3] += reward
            e[4] += reward * reward
            e[5] = reward if e[5] is None else min(e[5], reward)
            e[6] = reward if e[6] is None else max(e[6], reward)
            if task_index is not None:
                t = tasks[(team_id, env_id, version_id, split, task_index, hour)]
                t[0] += 1
                t[1] += passed
                t[2] += reward
        for kind, bucket in session_buckets.buckets_of(reward, calls):
            buckets[(team_id, env_id, version_id, hour, kind, bucket)] += 1
    return sessions, buckets, tasks


def session_rollup_advance(*, batch_size: int | None = None) -> RollupProgress:
    """Fold the next batch of ended sessions into the session rollups, atomically with marking them
    rolled up.

    The watermark is a flag on each session, not an id or a time: sessions end in any order (an
    episode of a week and one of a second, started together), and an ended session never changes
    again (sessions_end skips them), so "ended and not yet rolled up" is exactly what is left to
    fold, whenever it ended and however late it committed, with nothing to settle. The flag is set
    in the transaction that adds the sessions to the rollups, so a reader sees each session either
    in the rollups or in the unrolled tail, never both (selectors read both in one snapshot).
    Failed sessions are not folded: the client may still delete them, which ends them."""
    batch_size = batch_size or DEFAULT_SESSION_BATCH
    with transaction.atomic():
        cursor = _lock_cursor(SESSIONS_CURSOR)
        if cursor is None:
            return RollupProgress(folded=0, last_id=0, caught_up=False)  # another worker is folding
        # Locked, so a session moved to another run meanwhile (session_run_rename) is either moved
        # before this fold reads it or after it is rolled up, never in between.
        rows = list(
            Session.objects.select_for_update().filter(rolled_up=False, status__in=ENDED).order_by("id")
            .values_list("id", "team_id", "environment_id", "version_id", "split", "run_name", "api_key_id",
                         "created_at", "total_reward", "calls", "task_index")[:batch_size])
        # Anonymous sessions (no team sees them) are only marked, so they leave the tail's index.
        sessions, buckets, tasks = _fold_sessions([r for r in rows if r[1] is not None])
        _upsert_adding(SessionRollup, ("team", "environment", "version", "split", "run_name", "api_key_ref", "hour"),
                       _SESSION_MEASURES, [(*k, *v) for k, v in sessions.items()], combine=_SESSION_COMBINE)
        _upsert_adding(SessionBucketRollup, ("team", "environment", "version", "hour", "kind", "bucket"), ("count",),
                       [(*k, n) for k, n in buckets.items()])
        _upsert_adding(TaskRollup, ("team", "environment", "version", "split", "task_index", "hour"),
                       ("attempts", "passed", "reward_sum"), [(*k, *v) for k, v in tasks.items()])
        ids = [r[0] for r in rows]
        for i in range(0, len(ids), _IN_CHUNK):
            Session.objects.filter(pk__in=ids[i:i + _IN_CHUNK]).update(rolled_up=True)
        cursor.last_id = max([cursor.last_id, *ids])
        cursor.last_run_at = timezone.now()
        cursor.save()
    if rows:
        log.info("analytics rollup folded %d sessions", len(rows))
    return RollupProgress(folded=len(rows), last_id=cursor.last_id, caught_up=len(rows) < batch_size)


def session_rollup_run(*, max_batches: int = 1_000_000, batch_size: int | None = None) -> int:
    """Fold batches of ended sessions until none is left or max_batches is reached; returns the
    sessions folded."""
    folded = 0
    for _ in range(max_batches):
        progress = session_rollup_advance(batch_size=batch_size)
        folded += progress.folded
        if progress.folded == 0 or progress.caught_up:
            break
    return folded


_FOLDED_FIELDS = ("id", "team_id", "environment_id", "version_id", "split", "run_name", "api_key_id", "created_at",
                  "total_reward", "calls", "task_index")


def session_run_rename(*, pk: int, run_name: str) -> None:
    """Move a session to another run (runs.services does, when a rollout logged later claims a
    session that took its key's name), keeping the session rollup right: a rolled-up session's
    measures leave its old run's row (whose extremes are read again from that row's remaining
    sessions: one hour of one run, by the (team, run_name, created_at) index) for the new run's."""
    with transaction.atomic():
        if Session.objects.filter(pk=pk, rolled_up=False).update(run_name=run_name):
            return  # not folded yet: the fold will read the new name
        row = Session.objects.select_for_update().filter(pk=pk).values_list(*_FOLDED_FIELDS).first()
        if row is None or row[5] == run_name:
            return
        Session.objects.filter(pk=pk).update(run_name=run_name)
        if row[1] is None:
            return
        folded, _, _ = _fold_sessions([row])
        ((old_key, old),) = folded.items()
        hour = old_key[6]
        key = dict(zip(("team_id", "environment_id", "version_id", "split", "run_name", "api_key_ref", "hour"),
                       old_key, strict=True))
        SessionRollup.objects.filter(**key).update(
            episodes=F("episodes") - old[0], scored=F("scored") - old[1], passed=F("passed") - old[2],
            reward_sum=F("reward_sum") - old[3], reward_sq_sum=F("reward_sq_sum") - old[4],
            calls_sum=F("calls_sum") - old[7])
        left = Session.objects.filter(
            team_id=row[1], run_name=row[5], created_at__gte=hour, created_at__lt=hour + timedelta(hours=1),
            environment_id=row[2], version_id=row[3], split=row[4], rolled_up=True,
            **({"api_key_id": row[6]} if row[6] else {"api_key__isnull": True}))
        extremes = left.aggregate(n=Count("id"), reward_min=Min("total_reward"), reward_max=Max("total_reward"),
                                  calls_max=Max("calls"), first_created_at=Min("created_at"),
                                  last_created_at=Max("created_at"))
        if not extremes.pop("n"):
            SessionRollup.objects.filter(**key).delete()
        else:
            SessionRollup.objects.filter(**key).update(**extremes)
        sessions, _, _ = _fold_sessions([(*row[:5], run_name, *row[6:])])
        _upsert_adding(SessionRollup, ("team", "environment", "version", "split", "run_name", "api_key_ref", "hour"),
                       _SESSION_MEASURES, [(*k, *v) for k, v in sessions.items()], combine=_SESSION_COMBINE)


def session_rollup_rebuild() -> None:
    """Forget the session rollups so the next runs fold every ended session again (after a bug fix,
    or a change of ORS_ANALYTICS_PASS_REWARD, which decides `passed`). Until they have, the pages
    read the unfolded sessions live: the figures stay right, only slower."""
    with transaction.atomic():
        SessionRollup.objects.all().delete()
        SessionBucketRollup.objects.all().delete()
        TaskRollup.objects.all().delete()
        Session.objects.filter(rolled_up=True).update(rolled_up=False)
        RollupCursor.objects.filter(name=SESSIONS_CURSOR).delete()


def _enqueue_rollup(name: str) -> None:
    def enqueue() -> None:
        # A page must not fail, nor wait on broker retries, because a nudge could not be sent: beat
        # runs the rollup anyway.
        try:
            task(name).apply_async(kwargs={"max_batches": 3, "requeue": False}, retry=False)
        except Exception:  # noqa: BLE001 - any broker failure
            log.warning("analytics rollup nudge failed", exc_info=True)

    transaction.on_commit(enqueue)


def rollup_nudge() -> None:
    """Ask the worker for rollup runs when a page finds a rollup behind (a few batches, no
    re-queue): beat runs them every 30 s anyway, but a fresh install's pages fill in as they are viewed."""
    cursors = dict(RollupCursor.objects.filter(name__in=[CURSOR_NAME, SESSIONS_CURSOR])
                   .values_list("name", "last_run_at"))
    recent = timezone.now() - timedelta(seconds=max(5.0, settle_seconds()))
    calls_run = cursors.get(CURSOR_NAME)
    if calls_run is None or calls_run < recent:
        last_id = RollupCursor.objects.filter(name=CURSOR_NAME).values_list("last_id", flat=True).first() or 0
        if ToolCall.objects.filter(id__gt=last_id).exists():
            _enqueue_rollup("analytics.rollup_tool_calls")
    sessions_run = cursors.get(SESSIONS_CURSOR)
    if (sessions_run is None or sessions_run < recent) and Session.objects.filter(
            rolled_up=False, status__in=ENDED).exists():
        _enqueue_rollup("analytics.rollup_sessions")
