"""Retention and the archive (orsplatform/auditlog/archive.py) on PostgreSQL: a day past every
team's retention is written to Parquet, verified, then its partition dropped; a team's retention
never touches another team's rows; a crash between archive and drop leaves both copies and the
next run finishes; an archive falling behind is logged."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pyarrow.parquet as pq
from django.db import connections

from orsplatform.auditlog import archive
from orsplatform.auditlog.models import ArchivedPeriod, RetentionPolicy
from orsplatform.auditlog.selectors import calls_of_sessions
from orsplatform.auditlog.store import DirectoryStore, sha256_of
from tests.fixtures.server import ROOT


def keep(seeded, team, days: int) -> None:
    RetentionPolicy.objects.using(seeded.alias).update_or_create(
        team=team, defaults={"hot_days": days, "updated_at": datetime.now(UTC)})


def exists(alias: str, table: str) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [table])
        return cursor.fetchone()[0] is not None


def from_file(store: DirectoryStore, period: ArchivedPeriod) -> list[tuple]:
    import orjson

    def json(text):
        return None if text is None else orjson.loads(text)

    rows = pq.read_table(store.local(period.key)).to_pylist()
    return sorted((r["id"], r["session_id"], r["task_id"], r["name"], json(r["input"]), r["status"],
                   json(r["output"]), r["reward"], r["finished"], r["error"], r["started_at"],
                   r["finished_at"]) for r in rows)


def test_a_day_past_every_teams_retention_is_archived_verified_and_then_its_partition_dropped(seeded):
    keep(seeded, seeded.acme, 5)
    keep(seeded, seeded.globex, 5)
    before = {"acme": seeded.calls("acme"), "globex": seeded.calls("globex")}

    report = archive.archive_run(store=seeded.store, using=seeded.alias)

    assert seeded.partition in report.dropped_partitions
    assert not exists(seeded.alias, seeded.partition)
    for slug, team in (("acme", seeded.acme), ("globex", seeded.globex)):
        period = ArchivedPeriod.objects.using(seeded.alias).get(day=seeded.day, team_ref=team.pk)
        assert period.state == ArchivedPeriod.State.DROPPED and period.rows == 6
        assert period.key.endswith(f"{period.sha256[:16]}.parquet")  # named by its content
        assert sha256_of(seeded.store.local(period.key)) == period.sha256
        assert from_file(seeded.store, period) == before[slug]  # every value as it was stored
        assert pq.read_metadata(seeded.store.local(period.key)).row_group(0).column(0).compression == "ZSTD"
        assert seeded.calls(slug) == []
    # The calls read back through the selector every page and export uses, marked archived.
    calls = calls_of_sessions(seeded.sessions["acme"])  # default database on PostgreSQL runs
    if seeded.alias == "default":
        assert sorted(c.pk for cs in calls.values() for c in cs) == [r[0] for r in before["acme"]]
        assert all(c.archived for cs in calls.values() for c in cs)


def test_a_teams_retention_archives_its_rows_only_and_never_touches_another_teams(seeded):
    keep(seeded, seeded.acme, 5)  # globex keeps the platform's default (90 days)
    globex_before = seeded.calls("globex")

    report = archive.archive_run(store=seeded.store, using=seeded.alias)

    assert report.deleted == [(seeded.day, seeded.acme.pk, 6)]
    assert exists(seeded.alias, seeded.partition)  # globex's rows still live there
    assert seeded.calls("acme") == []
    assert seeded.calls("globex") == globex_before
    assert seeded.rows_in_partition() == {seeded.globex.pk: 6}
    assert not ArchivedPeriod.objects.using(seeded.alias).filter(team_ref=seeded.globex.pk).exists()
    assert not any(p for p in seeded.store.root.rglob("*.parquet") if f"team={seeded.globex.pk}/" in str(p))
    # A run later changes nothing more.
    again = archive.archive_run(store=seeded.store, using=seeded.alias)
    assert again.deleted == [] and seeded.calls("globex") == globex_before


ARCHIVE = """
import django; django.setup()
from orsplatform.auditlog import archive
archive.archive_run()
"""


def test_a_crash_between_archive_and_drop_leaves_both_copies_and_the_next_run_finishes(seeded, server_database):
    keep(seeded, seeded.acme, 5)
    keep(seeded, seeded.globex, 5)
    before = seeded.calls("acme")
    holder = connections[seeded.alias]
    env = {**os.environ, "DATABASE_URL": server_database.url(), "DJANGO_SETTINGS_MODULE": "orsplatform.settings",
           "ORS_AUDIT_ARCHIVE_URL": str(seeded.store.root), "ORS_AUDIT_ARCHIVE_DIR": str(seeded.store.root.parent),
           "ORS_AUDIT_LOCK_TIMEOUT_SECONDS": "120"}
    # A reader holds the partition, so the archiver's detach waits there: the moment to kill it.
    import psycopg

    reader = psycopg.connect(server_database.url())
    reader.execute(f"LOCK TABLE {seeded.partition} IN ACCESS SHARE MODE")
    proc = subprocess.Popen([sys.executable, "-c", ARCHIVE], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _waiting_on(holder, seeded.partition):
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the archiver never reached the drop"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        reader.rollback()
        reader.close()

    periods = list(ArchivedPeriod.objects.using(seeded.alias).filter(day=seeded.day))
    assert {p.state for p in periods} == {ArchivedPeriod.State.VERIFIED}
    acme = next(p for p in periods if p.team_ref == seeded.acme.pk)
    assert from_file(seeded.store, acme) == before  # the archive is whole...
    assert seeded.calls("acme") == before  # ...and the database still has every row
    if seeded.alias == "default":  # read from the database alone, once each
        assert sorted(c.pk for cs in calls_of_sessions(seeded.sessions["acme"]).values() for c in cs) == [
            r[0] for r in before]

    report = archive.archive_run(store=seeded.store, using=seeded.alias)
    assert seeded.partition in report.dropped_partitions
    assert set(ArchivedPeriod.objects.using(seeded.alias).filter(day=seeded.day).values_list("state", flat=True)) == {
        ArchivedPeriod.State.DROPPED}
    assert from_file(seeded.store, acme) == before


def _waiting_on(connection, table: str) -> bool:
    with connection.cursor() as cursor:
        # pg_locks spans the server: this database's relation only (parallel test databases share it).
        cursor.execute("SELECT EXISTS(SELECT 1 FROM pg_locks WHERE NOT granted AND relation = to_regclass(%s)"
                       " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
                       [table])
        return cursor.fetchone()[0]


def test_rows_that_arrive_after_verification_send_the_period_back_and_nothing_is_lost(seeded):
    keep(seeded, seeded.acme, 5)
    keep(seeded, seeded.globex, 5)
    for team in (seeded.acme, seeded.globex):
        archive.period_write(day=seeded.day, team_ref=team.pk, store=seeded.store, using=seeded.alias)
    late = seeded.sessions["acme"][0]
    from orsplatform.episodes.models import ToolCall

    ToolCall.objects.using(seeded.alias).create(session=late, task_id="late-call", name="move",
                                                started_at=late.created_at)
    assert not archive.partition_drop(day=seeded.day, using=seeded.alias)
    assert ArchivedPeriod.objects.using(seeded.alias).get(team_ref=seeded.acme.pk).state == "writing"
    assert len(seeded.calls("acme")) == 7

    archive.archive_run(store=seeded.store, using=seeded.alias)  # written again, with the late call
    period = ArchivedPeriod.objects.using(seeded.alias).get(team_ref=seeded.acme.pk)
    assert period.state == ArchivedPeriod.State.DROPPED and period.rows == 7
    assert "late-call" in {r[2] for r in from_file(seeded.store, period)}


def test_an_archive_that_falls_behind_is_said_in_the_log(seeded, tmp_path, caplog):
    keep(seeded, seeded.acme, 5)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the store's folder should be")
    with caplog.at_level(logging.WARNING, logger="orsplatform.auditlog.archive"):
        report = archive.archive_run(store=DirectoryStore(blocked), using=seeded.alias)
    assert report.failed and report.behind == [(seeded.day, seeded.acme.pk)]
    assert len(seeded.calls("acme")) == 6  # nothing left the database without its archive
    assert "audit archive behind" in caplog.text
