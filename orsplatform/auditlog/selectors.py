"""Reads of the audit log's retention and archive, and of calls wherever they are kept."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import orjson
import pyarrow.parquet as pq
from django.conf import settings

from orsplatform.auditlog.models import ArchivedPeriod, RetentionPolicy
from orsplatform.auditlog.partitions import TOOL_CALLS
from orsplatform.auditlog.store import archive_store
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team


@dataclass(frozen=True)
class Retention:
    hot_days: int
    platform_default: bool  # the team has no policy of its own
    archived_days: int  # days of the team's calls in the archive
    archived_rows: int
    archived_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"hot_days": self.hot_days, "platform_default": self.platform_default,
                "archived_days": self.archived_days, "archived_rows": self.archived_rows,
                "archived_bytes": self.archived_bytes}


def retention_of(*, team: Team) -> Retention:
    policy = RetentionPolicy.objects.filter(team=team).values_list("hot_days", flat=True).first()
    archived = ArchivedPeriod.objects.filter(team_ref=team.pk, table=TOOL_CALLS.table,
                                             state=ArchivedPeriod.State.DROPPED)
    days = rows = size = 0
    for n, b in archived.values_list("rows", "bytes"):
        days, rows, size = days + 1, rows + n, size + b
    return Retention(hot_days=policy or settings.ORS_AUDIT_RETENTION_DAYS, platform_default=policy is None,
                     archived_days=days, archived_rows=rows, archived_bytes=size)


def _days(session: Session) -> set[date]:
    """The UTC days a session's calls can fall on (a day either side, for clocks)."""
    start = session.created_at.date() - timedelta(days=1)
    end = (session.ended_at or session.last_activity_at or session.created_at).date() + timedelta(days=1)
    return {start + timedelta(days=n) for n in range((end - start).days + 1)}


def _archived_call(row: dict[str, Any]) -> ToolCall:
    call = ToolCall(id=row["id"], session_id=row["session_id"], task_id=row["task_id"], name=row["name"],
                    input=orjson.loads(row["input"]) if row["input"] is not None else None, status=row["status"],
                    output=orjson.loads(row["output"]) if row["output"] is not None else None,
                    reward=row["reward"], finished=row["finished"], error=row["error"],
                    started_at=row["started_at"], finished_at=row["finished_at"])
    call.archived = True  # shown as such by the pages and exports
    return call


def archived_calls(sessions: list[Session]) -> dict[int, list[ToolCall]]:
    """The calls of these sessions that were archived and left the database, by session id."""
    wanted: dict[tuple[int, date], set[int]] = defaultdict(set)
    for s in sessions:
        for day in _days(s):
            wanted[(s.team_id or 0, day)].add(s.pk)
    if not wanted:
        return {}
    periods = ArchivedPeriod.objects.filter(
        table=TOOL_CALLS.table, state=ArchivedPeriod.State.DROPPED,
        team_ref__in={ref for ref, _ in wanted}, day__in={day for _, day in wanted})
    out: dict[int, list[ToolCall]] = defaultdict(list)
    store = None
    for period in periods:
        ids = wanted.get((period.team_ref, period.day))
        if not ids:
            continue
        store = store or archive_store()
        table = pq.read_table(store.local(period.key), filters=[("session_id", "in", sorted(ids))])
        for row in table.to_pylist():
            out[row["session_id"]].append(_archived_call(row))
    return out


def calls_of_sessions(sessions: list[Session], *, limit: int | None = None) -> dict[int, list[ToolCall]]:
    """Each session's calls in order (started_at, id), from the database and, for days archived and
    dropped, from the archive (those carry `archived = True`). `limit` bounds each session's list."""
    by_session: dict[int, dict[int, ToolCall]] = defaultdict(dict)
    for call in ToolCall.objects.filter(session_id__in=[s.pk for s in sessions]).order_by("started_at", "id"):
        by_session[call.session_id][call.pk] = call
    for session_id, calls in archived_calls(sessions).items():
        for call in calls:
            by_session[session_id].setdefault(call.pk, call)  # a row in both: the database's
    ordered = {}
    for session_id, calls in by_session.items():
        rows = sorted(calls.values(), key=lambda c: (c.started_at, c.pk))
        ordered[session_id] = rows[:limit] if limit is not None else rows
    return ordered


def session_archived(session: Session) -> bool:
    """Has any day of this session's calls left the database for the archive?"""
    return ArchivedPeriod.objects.filter(table=TOOL_CALLS.table, state=ArchivedPeriod.State.DROPPED,
                                         team_ref=session.team_id or 0, day__in=_days(session)).exists()


def archive_summary() -> dict[str, Any]:
    """The archive's totals (operators' page)."""
    periods = ArchivedPeriod.objects.filter(table=TOOL_CALLS.table)
    by_state: dict[str, int] = defaultdict(int)
    for state in periods.values_list("state", flat=True):
        by_state[state] += 1
    newest = periods.filter(state=ArchivedPeriod.State.DROPPED).order_by("-day").values_list("day", flat=True).first()
    return {"periods": dict(by_state), "newest_dropped_day": newest}



# Tables that grow with use, largest first in a busy installation (the operators' storage page).
GROWING_TABLES = ("episodes_toolcall", "episodes_session", "runs_rolloutmessage", "runs_rollout",
                  "evals_evalepisode", "analytics_callrollup", "analytics_latencyrollup")


@dataclass(frozen=True)
class TeamStorage:
    team: Team
    hot_days: int
    calls_in_database: int  # from the rollups (every folded call not archived)
    bytes_in_database: int  # its share of the audit log's size, by calls
    archived_rows: int
    archived_bytes: int


def _table_sizes(tables: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """(rows estimate, bytes with indexes and partitions) per table; PostgreSQL only."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return {}
    out = {}
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(
                "SELECT COALESCE(SUM(c.reltuples) FILTER (WHERE c.reltuples > 0), 0)::bigint,"
                " COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
                " WHERE c.oid = to_regclass(%s) OR c.oid IN (SELECT inhrelid FROM pg_inherits"
                " WHERE inhparent = to_regclass(%s))", [table, table])
            out[table] = tuple(cursor.fetchone())
    return out


def storage_report() -> dict[str, Any]:
    """Disk per table and per team, the audit log's partitions and the archive (operators only:
    it spans every team)."""
    from django.db.models import Sum

    from orsplatform.analytics.models import CallRollup
    from orsplatform.auditlog import partitions

    sizes = _table_sizes(GROWING_TABLES)
    log_rows, log_bytes = sizes.get(TOOL_CALLS.table, (0, 0))
    policies = dict(RetentionPolicy.objects.values_list("team_id", "hot_days"))
    archived: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for ref, rows, size in ArchivedPeriod.objects.filter(state=ArchivedPeriod.State.DROPPED).values_list(
            "team_ref", "rows", "bytes"):
        archived[ref][0] += rows
        archived[ref][1] += size
    calls = dict(CallRollup.objects.values("team").annotate(n=Sum("calls")).values_list("team", "n"))
    total_live = max(sum(max(n - archived[t][0], 0) for t, n in calls.items()), 1)
    teams = []
    for team in Team.objects.filter(pk__in=set(calls) | set(archived)).order_by("slug"):
        live = max(calls.get(team.pk, 0) - archived[team.pk][0], 0)
        teams.append(TeamStorage(team=team, hot_days=policies.get(team.pk, settings.ORS_AUDIT_RETENTION_DAYS),
                                 calls_in_database=live, bytes_in_database=log_bytes * live // total_live,
                                 archived_rows=archived[team.pk][0], archived_bytes=archived[team.pk][1]))
    teams.sort(key=lambda t: -t.bytes_in_database)
    return {"tables": [(t, *sizes[t]) for t in GROWING_TABLES if t in sizes], "teams": teams,
            "partitions": partitions.partitions_list(TOOL_CALLS), "archive": archive_summary(),
            "default_hot_days": settings.ORS_AUDIT_RETENTION_DAYS}
