"""Task quotas: a split and a team hold at most ORS_MAX_TASKS_PER_SPLIT / ORS_MAX_TASKS_PER_TEAM tasks.
A file past either is refused whole with a 413 naming the quota: nothing ingested, the split as it
was, no staged file left."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orsplatform.catalog import tasks
from orsplatform.catalog.models import Environment, IngestJob, Split, Task
from tests.catalog.conftest import leftover_uploads, stored_packages
from tests.catalog.support import (
    FILE_TASKS_ENV,
    api,
    bare_environment,
    jsonl,
    publish,
    upload_tasks,
    zip_bytes,
)

QUESTIONS = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


@pytest.fixture
def quiz(owner) -> Environment:
    env = bare_environment(owner.team, "quiz")
    r = upload_tasks(owner, "quiz", "train", "train.jsonl", jsonl(QUESTIONS), mode="replace")
    assert r.status_code == 200, r.json()
    return env


def tasks_of(env: Environment, split: str) -> list:
    return list(Task.objects.filter(split__environment=env, split__name=split).order_by("index")
                .values_list("spec", flat=True))


def tiny_parquet(rows: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"n": pa.array([7] * rows, pa.int8())}), buf, compression="zstd")
    return buf.getvalue()


def refused_with_413(response, *, quota: str) -> str:
    assert response.status_code == 413, response.content
    body = response.json()
    assert body["check"] == "quota" and quota in body["detail"] and "Nothing was written" in body["detail"]
    return body["detail"]


def test_a_tiny_parquet_with_two_million_rows_stops_at_the_split_quota(owner, quiz, settings):
    assert settings.ORS_MAX_TASKS_PER_SPLIT == 1_000_000  # the default
    package = tiny_parquet(2_000_000)
    assert len(package) < 64 * 1024
    detail = refused_with_413(upload_tasks(owner, "quiz", "train", "t.parquet", package, mode="replace"),
                              quota="a split holds at most 1000000")
    assert "declares 2000000 rows" in detail
    assert tasks_of(quiz, "train") == QUESTIONS and Split.objects.get(environment=quiz, name="train").num_tasks == 5
    assert not Split.objects.filter(environment=quiz, name="other").exists()
    assert leftover_uploads(settings) == []


def test_a_text_file_is_counted_while_streaming_and_stopped_at_the_first_task_past_the_quota(owner, quiz, settings):
    settings.ORS_MAX_TASKS_PER_SPLIT = 1000
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl({"question": str(i)} for i in range(996)))
    refused_with_413(r, quota="a split holds at most 1000; split 'train' and keeps its 5")
    assert tasks_of(quiz, "train") == QUESTIONS
    exactly = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl({"question": str(i)} for i in range(995)))
    assert exactly.status_code == 200 and exactly.json()["num_tasks"] == 1000


def test_a_queued_ingest_past_the_quota_fails_its_job_with_the_quota_and_writes_nothing(owner, quiz, settings,
                                                                                        monkeypatch):
    monkeypatch.setattr(tasks.ingest_tasks, "delay", lambda job_id: None)  # a broker that is slow to deliver
    r = upload_tasks(owner, "quiz", "train", "t.parquet", tiny_parquet(50), mode="replace")
    assert r.status_code == 202
    settings.ORS_MAX_TASKS_PER_SPLIT = 20  # lowered while the job waited in the queue
    tasks.ingest_tasks.apply(args=[r.json()["id"]])
    job = api(owner).get(f"/api/v1/ingest-jobs/{r.json()['id']}").json()
    assert job["status"] == "failed" and job["error_report"]["check"] == "quota"
    assert "a split holds at most 20" in job["error_report"]["detail"]
    assert tasks_of(quiz, "train") == QUESTIONS
    assert IngestJob.objects.get(id=job["id"]).source_path == "" and leftover_uploads(settings) == []


def test_the_team_quota_counts_every_split_of_every_environment(owner, quiz, settings):
    settings.ORS_MAX_TASKS_PER_TEAM = 8
    bare_environment(owner.team, "second")
    r = upload_tasks(owner, "second", "test", "t.jsonl", jsonl(QUESTIONS))
    detail = refused_with_413(r, quota="a team holds at most 8 in all its splits")
    assert "holds 5 besides this file" in detail
    assert not Task.objects.filter(split__environment__slug="second").exists()
    # A replace frees the split's own tasks first: 8 in place of 5 fits.
    replaced = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl({"q": i} for i in range(8)), mode="replace")
    assert replaced.status_code == 200 and replaced.json()["num_tasks"] == 8


def test_another_teams_tasks_do_not_count_against_a_team(owner, outsider, quiz, settings):
    settings.ORS_MAX_TASKS_PER_TEAM = 8
    bare_environment(outsider.team, "theirs")
    r = upload_tasks(outsider, "theirs", "train", "t.jsonl", jsonl({"q": i} for i in range(8)))
    assert r.status_code == 200, r.json()


def test_a_package_whose_task_file_passes_the_quota_is_refused_with_413_and_publishes_nothing(owner, settings):
    settings.ORS_MAX_TASKS_PER_SPLIT = 3
    package = zip_bytes({"env.py": FILE_TASKS_ENV, "tasks/train.jsonl": jsonl(QUESTIONS)})
    r = publish(owner, "packaged", "p.zip", package)
    assert r.status_code == 413, r.json()
    assert r.json()["check"] == "quota" and "tasks/train.jsonl" in r.json()["detail"]
    assert not Environment.objects.filter(slug="packaged").exists()
    assert stored_packages(settings) == [] and leftover_uploads(settings) == []
