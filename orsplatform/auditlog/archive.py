"""Retention of the audit log: days past a team's retention are written to the archive store as
Parquet, verified, and only then leave the database (docs/audit-log.md).

One file per (day, team): the team's calls of that day's partition, sorted by session and time,
zstd-compressed, named by its content's SHA-256. The steps, each recorded on an ArchivedPeriod
before the next begins, so that a crash anywhere leaves the rows in the database, in the archive,
or in both, never in neither, and the next run goes on from the recorded state:

1. `writing`: the file is written to a temporary file, hashed, put in the store under its name;
2. `verified`: read back from the store, its SHA-256 and its row count (Parquet metadata) equal
   what was written and what the database holds for that day and team;
3. `dropped`: the rows leave the database, by detaching and dropping the day's partition when every
   team in it is verified, or else by deleting this team's rows from that one partition (another
   team, with a longer retention, keeps its rows). Both re-count every team's rows under a lock
   that stops writes to that partition first: a row that arrived since its verification sends
   the period back to `writing`.

PostgreSQL only (the partitions are PostgreSQL's); on SQLite retention does nothing yet.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import OperationalError, connections, transaction
from django.utils import timezone

from orsplatform.auditlog import partitions
from orsplatform.auditlog.models import ArchivedPeriod, RetentionPolicy
from orsplatform.auditlog.store import ArchiveStore, archive_store, sha256_of

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    ("id", pa.int64()), ("session_id", pa.int64()), ("task_id", pa.string()), ("name", pa.string()),
    ("input", pa.string()), ("status", pa.string()), ("output", pa.string()), ("reward", pa.float64()),
    ("finished", pa.bool_()), ("error", pa.string()), ("started_at", pa.timestamp("us", tz="UTC")),
    ("finished_at", pa.timestamp("us", tz="UTC")),
])
# Times as microseconds since the epoch: read as integers and cast by Arrow, not parsed into a
# Python datetime each (that parsing was half the archive's time, bench/audit_archive.py).
SELECT = ("SELECT t.id, t.session_id, t.task_id, t.name, t.input::text, t.status, t.output::text, t.reward,"
          " t.finished, t.error, (EXTRACT(EPOCH FROM t.started_at) * 1000000)::bigint,"
          " (EXTRACT(EPOCH FROM t.finished_at) * 1000000)::bigint")
MICROS = pa.int64()
FETCH_ROWS = 50_000
ROW_GROUP_ROWS = 100_000


class ArchiveMismatch(RuntimeError):
    """The archive read back is not what was written, or the database changed meanwhile."""


@dataclass
class ArchiveReport:
    archived: list[tuple[date, int]] = field(default_factory=list)  # (day, team ref) verified now
    dropped_partitions: list[str] = field(default_factory=list)
    deleted: list[tuple[date, int, int]] = field(default_factory=list)  # (day, team ref, rows)
    behind: list[tuple[date, int]] = field(default_factory=list)  # past retention + lag, still in the database
    failed: list[tuple[date, int, str]] = field(default_factory=list)


def hot_days_by_team(using: str = "default") -> dict[int, int]:
    return dict(RetentionPolicy.objects.using(using).values_list("team_id", "hot_days"))


def _team_clause(team_ref: int) -> tuple[str, list]:
    return ("s.team_id IS NULL", []) if team_ref == 0 else ("s.team_id = %s", [team_ref])


def team_counts(partition: str, *, using: str = "default") -> dict[int, int]:
    """Rows of a partition per team ref (0: sessions without a team)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(s.team_id, 0), COUNT(*) FROM {partition} t"
                       " JOIN episodes_session s ON s.id = t.session_id GROUP BY 1")
        return dict(cursor.fetchall())


def _write_parquet(partition: str, team_ref: int, path: Path, using: str) -> int:
    where, params = _team_clause(team_ref)
    rows = 0
    with transaction.atomic(using=using), connections[using].chunked_cursor() as cursor, \
            pq.ParquetWriter(path, SCHEMA, compression="zstd") as writer:
        cursor.execute(f"{SELECT} FROM {partition} t JOIN episodes_session s ON s.id = t.session_id"
                       f" WHERE {where} ORDER BY t.session_id, t.started_at, t.id", params)
        while batch := cursor.fetchmany(FETCH_ROWS):
            columns = list(zip(*batch, strict=True))
            arrays = [pa.array(c, type=MICROS).cast(f.type) if pa.types.is_timestamp(f.type) else pa.array(c, type=f.type)
                      for c, f in zip(columns, SCHEMA, strict=True)]
            writer.write_table(pa.table(arrays, schema=SCHEMA), row_group_size=ROW_GROUP_ROWS)
            rows += len(batch)
    return rows


def period_write(*, day: date, team_ref: int, store: ArchiveStore, using: str = "default") -> ArchivedPeriod:
    """Steps 1 and 2 for one day and team: the file written, put in the store, read back, checked."""
    partition = partitions.partition_name(partitions.TOOL_CALLS, day)
    period, _ = ArchivedPeriod.objects.using(using).get_or_create(
        table=partitions.TOOL_CALLS.table, day=day, team_ref=team_ref,
        defaults={"created_at": timezone.now(), "state": ArchivedPeriod.State.WRITING})
    if period.state != ArchivedPeriod.State.WRITING:
        return period
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        path = Path(tmp) / "period.parquet"
        rows = _write_parquet(partition, team_ref, path, using)
        digest = sha256_of(path)
        key = f"{partitions.TOOL_CALLS.table}/team={team_ref}/{day:%Y-%m-%d}-{digest[:16]}.parquet"
        store.put(key, path)
        period.key, period.rows, period.sha256, period.bytes = key, rows, digest, path.stat().st_size
        period.save(using=using, update_fields=["key", "rows", "sha256", "bytes"])
    period_verify(period=period, store=store, using=using)
    return period


def period_verify(*, period: ArchivedPeriod, store: ArchiveStore, using: str = "default") -> None:
    """Step 2: the stored file's SHA-256 and row count against the record and the database."""
    if store.sha256(period.key) != period.sha256:
        raise ArchiveMismatch(f"{period.key}: the stored file's SHA-256 is not the one written")
    stored_rows = pq.read_metadata(store.local(period.key)).num_rows
    partition = partitions.partition_name(partitions.TOOL_CALLS, period.day)
    in_database = team_counts(partition, using=using).get(period.team_ref, 0)
    if not stored_rows == period.rows == in_database:
        raise ArchiveMismatch(f"{period.key}: {stored_rows} rows stored, {period.rows} written, "
                              f"{in_database} in the database")
    period.state, period.verified_at = ArchivedPeriod.State.VERIFIED, timezone.now()
    period.save(using=using, update_fields=["state", "verified_at"])


def _scratch() -> Path:
    path = settings.ORS_AUDIT_ARCHIVE_DIR / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _lock_timeout(cursor) -> None:
    """A detach or delete waits at most ORS_AUDIT_LOCK_TIMEOUT_SECONDS for its lock, then tries again
    on the next run: waiting longer would hold every writer queued behind it."""
    cursor.execute(f"SET LOCAL lock_timeout = '{int(settings.ORS_AUDIT_LOCK_TIMEOUT_SECONDS * 1000)}ms'")


def _locked_counts(cursor, partition: str) -> dict[int, int]:
    _lock_timeout(cursor)
    cursor.execute(f"LOCK TABLE {partition} IN SHARE MODE")  # no writes to it until the commit
    cursor.execute(f"SELECT COALESCE(s.team_id, 0), COUNT(*) FROM {partition} t"
                   " JOIN episodes_session s ON s.id = t.session_id GROUP BY 1")
    return dict(cursor.fetchall())


def _send_back(periods: list[ArchivedPeriod], using: str) -> None:
    ArchivedPeriod.objects.using(using).filter(pk__in=[p.pk for p in periods]).update(
        state=ArchivedPeriod.State.WRITING, verified_at=None)


def partition_drop(*, day: date, using: str = "default") -> bool:
    """Step 3 for a whole day: detach and drop its partition when every team in it is verified
    with the same row count; True when dropped."""
    partition = partitions.partition_name(partitions.TOOL_CALLS, day)
    periods = {p.team_ref: p for p in ArchivedPeriod.objects.using(using).filter(
        table=partitions.TOOL_CALLS.table, day=day, state=ArchivedPeriod.State.VERIFIED)}
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        counts = _locked_counts(cursor, partition)
        changed = [p for ref, p in periods.items() if counts.get(ref, 0) != p.rows]
        whole = not (set(counts) - set(periods) or changed)
        if whole:
            cursor.execute(f"ALTER TABLE {partitions.TOOL_CALLS.table} DETACH PARTITION {partition}")
            cursor.execute(f"DROP TABLE {partition}")
            ArchivedPeriod.objects.using(using).filter(pk__in=[p.pk for p in periods.values()]).update(
                state=ArchivedPeriod.State.DROPPED, dropped_at=timezone.now())
    if changed:
        _send_back(changed, using)
    return whole


def period_delete(*, period: ArchivedPeriod, using: str = "default") -> int:
    """Step 3 for one team of a day other teams still keep: its rows deleted from that partition."""
    partition = partitions.partition_name(partitions.TOOL_CALLS, period.day)
    where, params = _team_clause(period.team_ref)
    deleted = 0
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        counts = _locked_counts(cursor, partition)
        same = counts.get(period.team_ref, 0) == period.rows
        if same:
            cursor.execute(f"DELETE FROM {partition} t USING episodes_session s WHERE s.id = t.session_id"
                           f" AND {where}", params)
            deleted = cursor.rowcount
            period.state, period.dropped_at = ArchivedPeriod.State.DROPPED, timezone.now()
            period.save(using=using, update_fields=["state", "dropped_at"])
    if not same:
        _send_back([period], using)
    return deleted


def archive_run(*, today: date | None = None, store: ArchiveStore | None = None,
                using: str = "default") -> ArchiveReport:
    """Archive and drop every day past its teams' retention, oldest first (the beat's step)."""
    report = ArchiveReport()
    if not partitions.is_partitioned(partitions.TOOL_CALLS, using=using):
        return report
    today = today or datetime.now(UTC).date()
    store = store or archive_store()
    policies = hot_days_by_team(using)
    default = settings.ORS_AUDIT_RETENTION_DAYS
    longest = max([default, *policies.values()])
    # Only days past the shortest retention can hold anything due: the hot days are never read here.
    first_kept = today - timedelta(days=min([default, *policies.values()]))
    for part in partitions.partitions_list(partitions.TOOL_CALLS, using=using):
        if part.day is None or part.day >= first_kept:
            continue
        counts = team_counts(part.table, using=using)
        due = {ref for ref in counts if part.day < today - timedelta(days=policies.get(ref, default))}
        if not counts and part.day < today - timedelta(days=longest):
            _drop_empty(part.table, using, report)
            continue
        for ref in sorted(due):
            _archive_one(part.day, ref, store, using, report)
        try:
            if due and due == set(counts):
                if partition_drop(day=part.day, using=using):
                    report.dropped_partitions.append(part.table)
                continue
            for period in ArchivedPeriod.objects.using(using).filter(
                    table=partitions.TOOL_CALLS.table, day=part.day, team_ref__in=due,
                    state=ArchivedPeriod.State.VERIFIED):
                report.deleted.append((part.day, period.team_ref, period_delete(period=period, using=using)))
        except OperationalError as exc:  # a lock not had in time: the next run tries again
            report.failed.append((part.day, -1, str(exc)))
    _note_lag(today, policies, default, using, report)
    return report


def _archive_one(day: date, team_ref: int, store: ArchiveStore, using: str, report: ArchiveReport) -> None:
    try:
        period = period_write(day=day, team_ref=team_ref, store=store, using=using)
    except ArchiveMismatch as exc:
        log.error("audit archive: %s", exc)
        report.failed.append((day, team_ref, str(exc)))
        return
    except Exception as exc:  # the store unreachable, the disk full: the rows stay, retried next run
        log.exception("audit archive: writing %s of team %s failed", day, team_ref)
        report.failed.append((day, team_ref, f"{type(exc).__name__}: {exc}"))
        return
    if period.state == ArchivedPeriod.State.VERIFIED:
        report.archived.append((day, team_ref))


def _drop_empty(partition: str, using: str, report: ArchiveReport) -> None:
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        _lock_timeout(cursor)
        cursor.execute(f"ALTER TABLE {partitions.TOOL_CALLS.table} DETACH PARTITION {partition}")
        cursor.execute(f"DROP TABLE {partition}")
    report.dropped_partitions.append(partition)


def _note_lag(today: date, policies: dict[int, int], default: int, using: str, report: ArchiveReport) -> None:
    """Days past a team's retention plus ORS_AUDIT_ARCHIVE_LAG_DAYS whose rows are still in the
    database: the archive is falling behind (a store down, a disk full), said in the log."""
    lag = timedelta(days=settings.ORS_AUDIT_ARCHIVE_LAG_DAYS)
    first_kept = today - timedelta(days=min([default, *policies.values()])) - lag
    for part in partitions.partitions_list(partitions.TOOL_CALLS, using=using):
        if part.day is None or part.day >= first_kept:
            continue
        for ref in team_counts(part.table, using=using):
            if part.day < today - timedelta(days=policies.get(ref, default)) - lag:
                report.behind.append((part.day, ref))
    if report.behind:
        log.warning("audit archive behind: %d period(s) past retention still in the database, oldest %s "
                    "(team %s); failures: %s", len(report.behind), report.behind[0][0], report.behind[0][1],
                    report.failed or "none")
