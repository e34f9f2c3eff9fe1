"""Archive throughput: a day of the audit log written to Parquet, verified and dropped
(auditlog/archive.py), against PostgreSQL's own export of the same rows in the same run.

    .venv/bin/python bench/audit_archive.py [--rows 2000000] [--teams 2]

A fresh PostgreSQL database is created (and dropped afterwards) and migrated; --rows calls of one
day ten days ago are made by the server itself (INSERT ... SELECT generate_series: realistic JSON
input and output, --teams teams' sessions of 5 calls each), then ANALYZEd. Measured:

1. reference: `psql \\copy (SELECT the same columns of that day) TO file`: PostgreSQL's own export
   of the rows, uncompressed text;
2. the archive run (every team's retention 5 days): each team's file written (zstd Parquet),
   read back and verified (SHA-256, row counts), then the partition detached and dropped.

Reported: rows/s of both and their ratio, bytes per row in the database (the partition with its
indexes), in the reference's text and in the archive, and the seconds of each step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.audit_ingest import setup_django  # noqa: E402
from bench.compare import PG_ADMIN, postgres_database  # noqa: E402

SEED_CALLS = """
INSERT INTO episodes_toolcall (session_id, task_id, name, input, status, output, reward, finished, error,
                               started_at, finished_at)
SELECT s.id, md5(g::text) || md5((g * 7)::text), CASE WHEN g %% 5 = 4 THEN 'submit' ELSE 'move' END,
       jsonb_build_object('action', 'up', 'step', g %% 5, 'note', repeat('x', 20)), 'ok',
       jsonb_build_object('ok', true, 'output', jsonb_build_object(
           'blocks', jsonb_build_array(jsonb_build_object('type', 'text', 'text', 'You moved up to ' || g)),
           'metadata', null, 'reward', CASE WHEN g %% 5 = 4 THEN 1.0 ELSE 0.0 END, 'finished', g %% 5 = 4)),
       CASE WHEN g %% 5 = 4 THEN 1.0 ELSE 0.0 END, g %% 5 = 4, '',
       %(day)s::timestamptz + (g %% 86000) * interval '1 second',
       %(day)s::timestamptz + (g %% 86000) * interval '1 second' + interval '20 milliseconds'
FROM generate_series(%(start)s, %(stop)s) g JOIN episodes_session s ON s.sid = 'bench-' || (g / 5)
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--teams", type=int, default=2)
    return p.parse_args()


def seed(rows: int, teams: int, day: datetime) -> None:
    from django.db import connection

    from orsplatform.auditlog import partitions
    from orsplatform.catalog.models import Environment, EnvironmentVersion
    from orsplatform.teams.models import Team

    partitions.partition_ensure(partitions.TOOL_CALLS, day.date())
    made = [Team.objects.create(slug=f"bench{n}", name=f"Bench {n}") for n in range(teams)]
    env = Environment.objects.create(team=made[0], slug="audit", visibility="public")
    version = EnvironmentVersion.objects.create(environment=env, number=1, content_hash="0" * 64,
                                                package_path="", entrypoint="env:Env", status="ready")
    sessions = rows // 5 + 1
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO episodes_session (sid, team_id, environment_id, version_id, task_spec, split, task_index,"
            " sealed, status, runner, error, created_at, last_activity_at, ended_at, calls, finished, protocol,"
            " run_name) SELECT 'bench-' || g, (%s::bigint[])[1 + g %% %s], %s, %s, '{}', 'train', g, false,"
            " 'deleted', '', '', %s, %s, %s, 5, true, 'ors', '' FROM generate_series(0, %s) g",
            [[t.pk for t in made], teams, env.pk, version.pk, day, day, day, sessions])
        for start in range(0, rows, 500_000):
            cursor.execute(SEED_CALLS, {"day": day, "start": start, "stop": min(start + 500_000, rows) - 1})
        cursor.execute("ANALYZE episodes_toolcall")
    for team in made:
        from orsplatform.auditlog.services import retention_set

        retention_set(team=team, hot_days=5)


def reference(database_url: str, day: datetime, path: Path) -> float:
    from orsplatform.auditlog import partitions

    partition = partitions.partition_name(partitions.TOOL_CALLS, day.date())
    query = (f"SELECT t.id, t.session_id, t.task_id, t.name, t.input, t.status, t.output, t.reward, t.finished,"
             f" t.error, t.started_at, t.finished_at FROM {partition} t JOIN episodes_session s"
             f" ON s.id = t.session_id ORDER BY t.session_id, t.started_at, t.id")
    started = time.perf_counter()
    subprocess.run(["psql", *PG_ADMIN, "-q", "-d", database_url.rsplit("/", 1)[1], "-c",
                    f"\\copy ({query}) TO '{path}'"], check=True)
    return time.perf_counter() - started


def main() -> int:
    args = parse_args()
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=10)
    with postgres_database() as database_url, tempfile.TemporaryDirectory() as tmp:
        os.environ["ORS_AUDIT_ARCHIVE_DIR"] = str(Path(tmp) / "var")
        setup_django(database_url)
        from django.core.management import call_command
        from django.db import connection

        from orsplatform.auditlog import archive, partitions
        from orsplatform.auditlog.models import ArchivedPeriod
        from orsplatform.auditlog.store import DirectoryStore

        call_command("migrate", verbosity=0, interactive=False)
        t0 = time.perf_counter()
        seed(args.rows, args.teams, day)
        seeded_s = time.perf_counter() - t0
        partition = partitions.partition_name(partitions.TOOL_CALLS, day.date())
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_total_relation_size(%s::regclass), COUNT(*) FROM " + partition, [partition])
            db_bytes, rows = cursor.fetchone()
        print(f"seeded {rows:,} calls of {day.date()} in {seeded_s:.1f} s; the partition: {db_bytes / rows:.0f} B/row",
              flush=True)
        text = Path(tmp) / "reference.tsv"
        ref_s = reference(database_url, day, text)
        print(f"reference (psql \\copy of the same rows): {rows / ref_s:,.0f} rows/s", flush=True)
        store = DirectoryStore(Path(tmp) / "archive")
        t0 = time.perf_counter()
        report = archive.archive_run(store=store)
        run_s = time.perf_counter() - t0
        periods = list(ArchivedPeriod.objects.filter(day=day.date()))
        archived_rows = sum(p.rows for p in periods)
        archived_bytes = sum(p.bytes for p in periods)
        assert partition in report.dropped_partitions, report
        assert archived_rows == rows and all(p.state == ArchivedPeriod.State.DROPPED for p in periods)
        result = {
            "rows": rows, "teams": args.teams,
            "reference_rows_per_s": round(rows / ref_s), "archive_rows_per_s": round(rows / run_s),
            "ratio": round(ref_s / run_s, 3),
            "bytes_per_row": {"database": round(db_bytes / rows, 1), "reference_text": round(text.stat().st_size / rows, 1),
                              "archive_parquet_zstd": round(archived_bytes / rows, 1)},
            "archive_seconds": round(run_s, 2), "reference_seconds": round(ref_s, 2),
            "load_average": os.getloadavg(),
        }
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
