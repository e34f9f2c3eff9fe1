"""The audit log's daily partitions on PostgreSQL (orsplatform/auditlog/partitions.py, episodes
migration 0007): made ahead, a row outside them kept in the default partition and moved when its
day is made, and an upgraded installation's rows moved in resumable batches.

They run against a PostgreSQL server whatever the suite's database is (tests/fixtures/server_database.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from django.core.management import call_command
from django.db import connections

from orsplatform.auditlog import partitions
from orsplatform.episodes.models import Session, ToolCall
from tests.fixtures.server import ROOT
from tests.fixtures.server_database import PG_HOST, PG_PORT, PG_USER


def make_session(alias: str) -> Session:
    from orsplatform.catalog.models import EnvironmentVersion

    version = EnvironmentVersion.objects.using(alias).select_related("environment").first()
    now = datetime.now(UTC)
    return Session.objects.using(alias).create(
        sid=uuid.uuid4().hex, environment_id=version.environment_id, version=version, task_spec={},
        created_at=now, last_activity_at=now)


def partition_of(alias: str, task_id: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM episodes_toolcall WHERE task_id = %s", [task_id])
        return cursor.fetchone()[0]


def test_partitions_are_made_ahead_of_time_once_each(server_database):
    alias = server_database.alias
    assert partitions.is_partitioned(partitions.TOOL_CALLS, using=alias)
    start = datetime.now(UTC).date() + timedelta(days=400)
    created = partitions.partitions_ensure_ahead(today=start, ahead_days=3, using=alias)
    names = [partitions.partition_name(partitions.TOOL_CALLS, start + timedelta(days=d)) for d in range(-1, 4)]
    assert created == names
    assert partitions.partitions_ensure_ahead(today=start, ahead_days=3, using=alias) == []
    listed = [p.table for p in partitions.partitions_list(partitions.TOOL_CALLS, using=alias)]
    assert set(names) <= set(listed) and listed[-1] == "episodes_toolcall_default"


def test_a_call_of_a_day_without_a_partition_is_kept_and_moves_into_it_when_the_day_is_made(server_database):
    alias = server_database.alias
    session = make_session(alias)
    day = datetime.now(UTC).date() + timedelta(days=800)
    at = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    call = ToolCall.objects.using(alias).create(session=session, task_id=uuid.uuid4().hex, name="submit",
                                                started_at=at, finished_at=at)
    today = ToolCall.objects.using(alias).create(session=session, task_id=uuid.uuid4().hex, name="submit",
                                                 started_at=datetime.now(UTC))
    assert partition_of(alias, call.task_id) == "episodes_toolcall_default"
    assert partition_of(alias, today.task_id) == partitions.partition_name(partitions.TOOL_CALLS,
                                                                          datetime.now(UTC).date())

    assert partitions.partition_ensure(partitions.TOOL_CALLS, day, using=alias)
    assert partition_of(alias, call.task_id) == partitions.partition_name(partitions.TOOL_CALLS, day)
    assert ToolCall.objects.using(alias).get(pk=call.pk).started_at == at


SEED = """
import django; django.setup()
from datetime import UTC, datetime, timedelta
from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team
team = Team.objects.create(slug="t", name="T")
env = Environment.objects.create(team=team, slug="e", visibility="private")
version = EnvironmentVersion.objects.create(environment=env, number=1, content_hash="0" * 64, package_path="",
                                            entrypoint="env:Env", status="ready")
now = datetime.now(UTC)
session = Session.objects.create(sid="s", team=team, environment=env, version=version, task_spec={},
                                 created_at=now, last_activity_at=now)
ToolCall.objects.bulk_create([ToolCall(id=n, session=session, task_id=f"old-{n}", name="submit",
                                       started_at=now - timedelta(days=5) + timedelta(minutes=29 * n))
                              for n in range(1, 251)])
"""

MOVE_ONE_BATCH = """
import django; django.setup()
from orsplatform.auditlog import partitions
print(f"moved {partitions.legacy_move(batch=100).moved} rows")
"""


def test_an_upgraded_installation_keeps_its_calls_and_moves_them_into_partitions_resumably():
    """A database with calls in the unpartitioned table (migrated back to 0006), migrated: new calls
    go to the partitioned table at once, the old ones move by the command (stopped after a batch
    and run again), every row once, ids and values kept."""
    name = f"test_ors_upgrade_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}",
           "DJANGO_SETTINGS_MODULE": "orsplatform.settings"}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    try:
        run("manage.py", "migrate", "-v0")
        run("-c", SEED)
        run("manage.py", "migrate", "episodes", "0006", "-v0")  # back to one table, rows kept
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=name, autocommit=True) as db:
            assert _count(db, "episodes_toolcall") == 250
            run("manage.py", "migrate", "-v0")
            assert _count(db, "episodes_toolcall_legacy") == 250
            assert _count(db, "episodes_toolcall") == 0
            db.execute("INSERT INTO episodes_toolcall (session_id, task_id, name, input, status, finished, error,"
                       " started_at) SELECT session_id, 'new-call', name, input, status, finished, error, now()"
                       " FROM episodes_toolcall_legacy LIMIT 1")
            new_id = db.execute("SELECT id FROM episodes_toolcall WHERE task_id = 'new-call'").fetchone()[0]
            assert new_id > 250  # the sequence goes on from the legacy table's ids

            assert "moved 100 rows" in run("-c", MOVE_ONE_BATCH)
            assert _count(db, "episodes_toolcall_legacy") == 150
            assert "done: 150 rows moved" in run("manage.py", "audit_partitions", "migrate-legacy", "--batch", "100")
            assert db.execute("SELECT to_regclass('episodes_toolcall_legacy')").fetchone()[0] is None
            rows = db.execute("SELECT id, task_id, started_at, tableoid::regclass::text FROM episodes_toolcall"
                              " WHERE task_id <> 'new-call' ORDER BY id").fetchall()
            assert [r[0] for r in rows] == list(range(1, 251))
            assert all(r[1] == f"old-{r[0]}" for r in rows)
            # Each in its own day's partition (made for the old days too), none left in the default.
            assert all(r[3] == f"episodes_toolcall_p{r[2].astimezone(UTC):%Y%m%d}" for r in rows)
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _count(db, table: str) -> int:
    return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def test_the_command_says_so_on_a_database_without_partitions(live_db, capsys):
    from django.db import connection

    if connection.vendor == "postgresql":
        call_command("audit_partitions", "status")
        assert "episodes_toolcall_default" in capsys.readouterr().out
    else:
        call_command("audit_partitions", "status")
        assert "one table" in capsys.readouterr().out
