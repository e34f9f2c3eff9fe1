"""The archive in an S3-compatible store (auditlog/store.py, S3Store over boto3), against moto's own
S3 HTTP server on 127.0.0.1: files put whole, read back by checksum, fetched once into a cache;
and a day archived there, verified and dropped."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest

from orsplatform.auditlog import archive
from orsplatform.auditlog.models import ArchivedPeriod, RetentionPolicy
from orsplatform.auditlog.store import S3Store, sha256_of
from tests.fixtures.server import free_port

pytestmark = pytest.mark.services  # an S3 server on 127.0.0.1 (TCP)


@pytest.fixture
def s3(monkeypatch, tmp_path):
    from moto.server import ThreadedMotoServer

    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ors-archive")
        yield S3Store("ors-archive", "/audit/", endpoint, tmp_path / "cache")
    finally:
        server.stop()


def test_a_file_put_in_s3_reads_back_with_the_same_checksum_and_is_cached_once(s3, tmp_path):
    source = tmp_path / "period.parquet"
    source.write_bytes(b"PAR1" + bytes(range(256)) * 1000 + b"PAR1")
    s3.put("episodes_toolcall/team=1/2026-01-01-ab.parquet", source)
    assert s3.sha256("episodes_toolcall/team=1/2026-01-01-ab.parquet") == sha256_of(source)
    assert s3.sha256("episodes_toolcall/team=1/missing.parquet") is None
    local = s3.local("episodes_toolcall/team=1/2026-01-01-ab.parquet")
    assert local.read_bytes() == source.read_bytes()
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket="ors-archive")["Contents"]]
    assert keys == ["audit/episodes_toolcall/team=1/2026-01-01-ab.parquet"]  # under the prefix


def test_a_day_is_archived_to_s3_verified_there_and_then_dropped(seeded, s3):
    for team in (seeded.acme, seeded.globex):
        RetentionPolicy.objects.using(seeded.alias).create(team=team, hot_days=5, updated_at=datetime.now(UTC))
    report = archive.archive_run(store=s3, using=seeded.alias)
    assert seeded.partition in report.dropped_partitions
    for team in (seeded.acme, seeded.globex):
        period = ArchivedPeriod.objects.using(seeded.alias).get(day=seeded.day, team_ref=team.pk)
        assert period.state == ArchivedPeriod.State.DROPPED and period.rows == 6
        assert s3.sha256(period.key) == period.sha256
