"""The audit log's time partitions on PostgreSQL: one partition per UTC day, created ahead of time.

``episodes_toolcall`` is a table PARTITION BY RANGE (started_at) on PostgreSQL (episodes migration
0007), with a default partition that takes any row no daily partition covers, so a write never
fails for want of a partition. The beat (``auditlog.maintain``) creates the partitions of the days
ahead; ``partition_ensure`` moves what the default partition already holds for a day into that
day's partition. Partitions are detached and dropped only by the archiver, after their archive is
written and verified (auditlog/archive.py). SQLite keeps one plain table: nothing here runs there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db import connections, transaction


@dataclass(frozen=True)
class PartitionedTable:
    table: str  # the parent
    key: str  # the column partitioned by (a timestamptz)


TOOL_CALLS = PartitionedTable("episodes_toolcall", "started_at")
TABLES = {t.table: t for t in (TOOL_CALLS,)}


@dataclass(frozen=True)
class Partition:
    table: str  # the partition's own name
    day: date | None  # None: the default partition
    rows_estimate: int
    bytes: int


def enabled(using: str = "default") -> bool:
    return connections[using].vendor == "postgresql"


def partition_name(parent: PartitionedTable, day: date) -> str:
    return f"{parent.table}_p{day:%Y%m%d}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def is_partitioned(parent: PartitionedTable, *, using: str = "default") -> bool:
    if not enabled(using):
        return False
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
                       " WHERE c.relname = %s AND c.relnamespace = 'public'::regnamespace", [parent.table])
        return cursor.fetchone() is not None


def partitions_list(parent: PartitionedTable, *, using: str = "default") -> list[Partition]:
    """The parent's partitions, oldest day first, the default partition last."""
    if not enabled(using):
        return []
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid)"
            " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE p.relname = %s AND p.relnamespace = 'public'::regnamespace", [parent.table])
        rows = cursor.fetchall()
    out = []
    for name, estimate, size in rows:
        suffix = name[len(parent.table) + 2:]
        day = datetime.strptime(suffix, "%Y%m%d").date() if name.startswith(f"{parent.table}_p") else None
        out.append(Partition(name, day, max(int(estimate), 0), int(size)))
    return sorted(out, key=lambda p: (p.day is None, p.day or date.min))


def partition_ensure(parent: PartitionedTable, day: date, *, using: str = "default") -> bool:
    """Create the day's partition unless it exists; True when created. Rows of that day already in
    the default partition (written before the partition existed) are moved into it, in the same
    short transaction: the default partition is locked only while its rows of that day move."""
    name = partition_name(parent, day)
    start, end = day_bounds(day)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [parent.table])
        cursor.execute("SELECT to_regclass(%s)", [name])
        if cursor.fetchone()[0] is not None:
            return False
        default = f"{parent.table}_default"
        cursor.execute(f"SELECT EXISTS(SELECT 1 FROM {default} WHERE {parent.key} >= %s AND {parent.key} < %s)",
                       [start, end])
        if not cursor.fetchone()[0]:
            cursor.execute(f"CREATE TABLE {name} PARTITION OF {parent.table} FOR VALUES FROM (%s) TO (%s)",
                           [start, end])
            return True
        # Attaching a range the default partition holds rows of is refused: the rows move first.
        cursor.execute(f"CREATE TABLE {name} (LIKE {parent.table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        cursor.execute(f"WITH moved AS (DELETE FROM {default} WHERE {parent.key} >= %s AND {parent.key} < %s"
                       f" RETURNING *) INSERT INTO {name} SELECT * FROM moved", [start, end])
        cursor.execute(f"ALTER TABLE {parent.table} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)",
                       [start, end])
        return True


def partitions_ensure_ahead(*, today: date | None = None, ahead_days: int, behind_days: int = 1,
                            using: str = "default") -> list[str]:
    """The partitions of every partitioned table from `behind_days` before today to `ahead_days`
    after it; returns the names created."""
    if not enabled(using):
        return []
    today = today or datetime.now(UTC).date()
    created = []
    for parent in TABLES.values():
        if not is_partitioned(parent, using=using):
            continue
        for offset in range(-behind_days, ahead_days + 1):
            day = today + timedelta(days=offset)
            if partition_ensure(parent, day, using=using):
                created.append(partition_name(parent, day))
    return created


LEGACY = "episodes_toolcall_legacy"


@dataclass(frozen=True)
class LegacyProgress:
    moved: int  # rows moved by this call
    done: bool  # the legacy table is empty and dropped (or never was)


def legacy_move(*, batch: int = 10_000, using: str = "default") -> LegacyProgress:
    """Move the oldest `batch` rows of the table an upgrade left (migration 0007 renamed the
    unpartitioned audit log to episodes_toolcall_legacy) into the partitions; drop it once empty.
    Each batch is one transaction that deletes from the legacy table what it inserts, so a stopped
    move resumes where it was and no row is in both or neither; writers never wait for it (they
    write only the partitioned table). The partitions of the batch's days are made first."""
    if not enabled(using):
        return LegacyProgress(0, True)
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [LEGACY])
        if cursor.fetchone()[0] is None:
            return LegacyProgress(0, True)
        cursor.execute(f"SELECT MIN(id), MAX(id) FROM (SELECT id FROM {LEGACY} ORDER BY id LIMIT %s) b", [batch])
        low, high = cursor.fetchone()
        if low is None:
            cursor.execute(f"DROP TABLE IF EXISTS {LEGACY}")
            return LegacyProgress(0, True)
        cursor.execute(f"SELECT DISTINCT (started_at AT TIME ZONE 'UTC')::date FROM {LEGACY}"
                       " WHERE id BETWEEN %s AND %s", [low, high])
        days = sorted(d for (d,) in cursor.fetchall())
    for day in days:
        partition_ensure(TOOL_CALLS, day, using=using)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # A row the partitions already hold (the sweeper recorded the call again) is kept there.
        cursor.execute(f"WITH moved AS (DELETE FROM {LEGACY} WHERE id BETWEEN %s AND %s RETURNING *),"
                       f" ins AS (INSERT INTO {TOOL_CALLS.table} SELECT * FROM moved ON CONFLICT DO NOTHING)"
                       " SELECT COUNT(*) FROM moved", [low, high])
        moved = cursor.fetchone()[0]
    return LegacyProgress(moved, False)
