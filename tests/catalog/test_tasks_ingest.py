"""Task files through the REST API (and inside packages): each format, bad rows reported with their
line numbers, append and replace all or nothing, progress visible while an ingest runs."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from orsplatform.catalog import ingest, selectors, services
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


@pytest.fixture
def quiz(owner) -> Environment:
    return bare_environment(owner.team, "quiz")


def specs(env: Environment, split: str) -> list:
    return list(Task.objects.filter(split__environment=env, split__name=split).order_by("index")
                .values_list("spec", flat=True))


def split_row(env: Environment, name: str) -> Split:
    return Split.objects.get(environment=env, name=name)


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


QUESTIONS = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]


def test_a_jsonl_file_replaces_a_split_and_the_finished_job_is_returned(owner, quiz, settings):
    r = upload_tasks(owner, "quiz", "train", "train.jsonl", jsonl(QUESTIONS), mode="replace")
    assert r.status_code == 200, r.json()
    job = r.json()
    assert job["status"] == "succeeded" and job["rows_done"] == 5 and job["num_tasks"] == 5
    assert job["percent"] == 100 and job["split"] == "train" and job["mode"] == "replace"
    assert specs(quiz, "train") == QUESTIONS
    assert api(owner).get(f"/api/v1/ingest-jobs/{job['id']}").json()["status"] == "succeeded"
    assert leftover_uploads(settings) == []


def test_a_csv_file_gives_one_task_of_strings_per_row(owner, quiz):
    csv = 'question,answer\n"What is 1+1?",2\n"Say ""hi"", please",hi\n"two\nlines",x\n'
    r = upload_tasks(owner, "quiz", "test", "test.csv", csv, mode="replace")
    assert r.status_code == 200, r.json()
    assert specs(quiz, "test") == [{"question": "What is 1+1?", "answer": "2"},
                                   {"question": 'Say "hi", please', "answer": "hi"},
                                   {"question": "two\nlines", "answer": "x"}]


def test_a_parquet_file_keeps_its_column_types(owner, quiz):
    table = pa.table({"question": ["a", "b"], "answer": [1, 2], "tags": [["x"], []],
                      "meta": [{"level": 1}, {"level": 2}]})
    r = upload_tasks(owner, "quiz", "train", "train.parquet", parquet_bytes(table), mode="replace")
    assert r.status_code == 200, r.json()
    assert specs(quiz, "train") == [{"question": "a", "answer": 1, "tags": ["x"], "meta": {"level": 1}},
                                    {"question": "b", "answer": 2, "tags": [], "meta": {"level": 2}}]


def test_append_adds_after_the_last_task_and_bumps_the_revision(owner, quiz):
    upload_tasks(owner, "quiz", "train", "a.jsonl", jsonl(QUESTIONS[:2]), mode="replace")
    revision = split_row(quiz, "train").revision
    r = upload_tasks(owner, "quiz", "train", "b.jsonl", jsonl(QUESTIONS[2:]), mode="append")
    assert r.status_code == 200 and r.json()["rows_done"] == 3 and r.json()["num_tasks"] == 5
    assert specs(quiz, "train") == QUESTIONS
    assert list(Task.objects.filter(split__environment=quiz, split__name="train").order_by("index")
                .values_list("index", flat=True)) == [0, 1, 2, 3, 4]
    assert split_row(quiz, "train").revision == revision + 1


def test_replace_swaps_all_tasks(owner, quiz):
    upload_tasks(owner, "quiz", "train", "a.jsonl", jsonl(QUESTIONS), mode="replace")
    upload_tasks(owner, "quiz", "train", "b.jsonl", jsonl([{"question": "only", "answer": "1"}]), mode="replace")
    assert specs(quiz, "train") == [{"question": "only", "answer": "1"}]
    assert split_row(quiz, "train").num_tasks == 1


def test_malformed_lines_and_mixed_types_are_reported_with_their_line_numbers(owner, quiz):
    upload_tasks(owner, "quiz", "train", "a.jsonl", jsonl(QUESTIONS), mode="replace")
    before = split_row(quiz, "train")
    bad = '{"question": "ok"}\n{"question": oops}\n\n[1, 2]\n"just a string"\n{"question": "fine"}\n42\n'
    r = upload_tasks(owner, "quiz", "train", "bad.jsonl", bad, mode="append")
    assert r.status_code == 400
    body = r.json()
    assert "no task was written" in body["detail"]
    errors = {e["line"]: e["error"] for e in body["errors"]}
    assert sorted(errors) == [2, 4, 5, 7]
    assert errors[2].startswith("Not valid JSON")
    assert errors[4] == "expected a JSON object, got an array"
    assert errors[5] == "expected a JSON object, got a string"
    assert errors[7] == "expected a JSON object, got a number"
    assert body["job"]["status"] == "failed"
    after = split_row(quiz, "train")
    assert (after.num_tasks, after.revision) == (before.num_tasks, before.revision)
    assert specs(quiz, "train") == QUESTIONS


def test_a_failed_replace_leaves_the_previous_tasks_intact_even_after_whole_batches(owner, quiz, monkeypatch):
    monkeypatch.setattr(ingest, "BATCH", 100)  # several batches are written before the bad line
    upload_tasks(owner, "quiz", "train", "a.jsonl", jsonl(QUESTIONS), mode="replace")
    revision = split_row(quiz, "train").revision
    rows = jsonl({"question": f"new {i}", "answer": "x"} for i in range(450)) + "{broken\n"
    r = upload_tasks(owner, "quiz", "train", "b.jsonl", rows, mode="replace")
    assert r.status_code == 400 and r.json()["errors"][0]["line"] == 451
    assert specs(quiz, "train") == QUESTIONS
    assert split_row(quiz, "train").revision == revision


def test_csv_rows_with_the_wrong_number_of_fields_are_reported_by_line(owner, quiz):
    csv = "question,answer\na,1\nb,2,extra\nc\nd,4\n"
    r = upload_tasks(owner, "quiz", "train", "t.csv", csv, mode="replace")
    assert r.status_code == 400
    assert [(e["line"], e["error"]) for e in r.json()["errors"]] == [
        (3, "3 fields, the header has 2"), (4, "fewer fields than the header's 2")]
    assert specs(quiz, "train") == []


def test_a_csv_without_a_proper_header_is_refused(owner, quiz):
    r = upload_tasks(owner, "quiz", "train", "t.csv", "question,,answer\na,b,c\n", mode="replace")
    assert r.status_code == 400 and r.json()["errors"][0]["line"] == 1


def test_an_over_long_line_is_reported_without_reading_it_whole(owner, quiz, settings):
    settings.ORS_MAX_TASK_BYTES = 1000
    rows = jsonl([{"question": "x" * 5000}]) + jsonl([{"question": "short"}])
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", rows, mode="replace")
    assert r.status_code == 400 and r.json()["errors"] == [{"line": 1, "error": "line longer than 1000 bytes"}]


def test_an_empty_file_and_a_missing_or_invalid_split_name_are_400s(owner, quiz):
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", "\n\n", mode="replace")
    assert r.status_code == 400 and "no tasks" in r.json()["detail"]
    r = upload_tasks(owner, "quiz", "%20", "t.jsonl", jsonl(QUESTIONS))
    assert r.status_code == 400 and r.json()["detail"] == "A split name is required."
    r = upload_tasks(owner, "quiz", "bad*name", "t.jsonl", jsonl(QUESTIONS))
    assert r.status_code == 400 and "Invalid split name" in r.json()["detail"]
    assert not IngestJob.objects.filter(split_name__in=[" ", "bad*name"]).exists()


def test_a_new_split_can_be_created_by_an_upload_with_its_type(owner, quiz):
    r = upload_tasks(owner, "quiz", "hard", "h.jsonl", jsonl(QUESTIONS[:1]), type="test")
    assert r.status_code == 200, r.json()
    assert (split_row(quiz, "hard").type, split_row(quiz, "hard").num_tasks) == ("test", 1)


@pytest.mark.parametrize("filename,content,detail", [
    ("t.parquet", jsonl(QUESTIONS), "not a Parquet file"),
    ("t.jsonl", zip_bytes({"t.jsonl": "{}"}), "zip archive"),
    ("t.csv", b"\x1f\x8b\x08\x00binary", "gzip"),
    ("t.txt", jsonl(QUESTIONS), "Cannot tell the format"),
])
def test_a_task_file_that_is_not_what_its_name_says_is_refused(owner, quiz, filename, content, detail, settings):
    r = upload_tasks(owner, "quiz", "train", filename, content)
    assert r.status_code == 400 and detail in r.json()["detail"]
    assert leftover_uploads(settings) == []


def test_non_utf8_csv_is_reported_by_line(owner, quiz):
    r = upload_tasks(owner, "quiz", "train", "t.csv", b"question\nok\ncaf\xe9\n")
    assert r.status_code == 400 and r.json()["errors"][0]["error"].startswith("unreadable row")


def test_a_task_file_over_the_size_limit_answers_413(owner, quiz, settings):
    settings.ORS_MAX_TASK_FILE_BYTES = 1000
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS * 20))
    assert r.status_code == 413


def test_uploading_tasks_is_refused_across_teams_and_without_the_publish_scope(owner, member, outsider, quiz):
    r = upload_tasks(outsider, "quiz", "train", "t.jsonl", jsonl(QUESTIONS), team="acme")
    assert r.status_code == 404
    r = upload_tasks(member, "quiz", "train", "t.jsonl", jsonl(QUESTIONS))
    assert r.status_code == 403
    assert specs(quiz, "train") == []
    ok = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS)).json()
    assert api(outsider).get(f"/api/v1/ingest-jobs/{ok['id']}").status_code == 404
    assert api(outsider).get("/api/v1/environments/acme/quiz/splits/train/tasks").status_code == 404


def test_tasks_are_listed_page_by_page(owner, quiz):
    upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS), mode="replace")
    page = api(owner).get("/api/v1/environments/acme/quiz/splits/train/tasks?offset=1&limit=2").json()
    assert page["num_tasks"] == 5 and page["next"] == 3
    assert [t["index"] for t in page["tasks"]] == [1, 2] and page["tasks"][0]["spec"] == QUESTIONS[1]
    last = api(owner).get("/api/v1/environments/acme/quiz/splits/train/tasks?offset=3&limit=1000").json()
    assert last["next"] is None and len(last["tasks"]) == 2
    assert api(owner).get("/api/v1/environments/acme/quiz/splits/train/tasks?limit=1001").status_code == 400
    assert api(owner).get("/api/v1/environments/acme/quiz/splits/nope/tasks").status_code == 404


def test_a_queued_job_answers_202_and_a_worker_finishes_it_once(owner, quiz, monkeypatch):
    from orsplatform.catalog import tasks

    monkeypatch.setattr(tasks.ingest_tasks, "delay", lambda job_id: None)  # a broker that is slow to deliver
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS))
    assert r.status_code == 202 and r.json()["status"] == "queued" and r.json()["bytes_total"] > 0
    job_id = r.json()["id"]
    tasks.ingest_tasks.apply(args=[job_id])  # what the worker runs
    tasks.ingest_tasks.apply(args=[job_id])  # a redelivery does nothing
    job = api(owner).get(f"/api/v1/ingest-jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["num_tasks"] == 5
    assert specs(quiz, "train") == QUESTIONS


def test_progress_is_visible_while_the_ingest_transaction_is_open(owner, quiz, monkeypatch):
    monkeypatch.setattr(ingest, "BATCH", 100)
    monkeypatch.setattr(ingest, "PROGRESS_EVERY_SECONDS", 0)
    seen: list[tuple[int, int]] = []
    original = services._JobProgress.__call__

    def spy(self, rows_done: int, bytes_done: int) -> None:
        original(self, rows_done, bytes_done)
        if connection.vendor == "postgresql":
            # What any other connection sees while the ingest transaction (and its COPY) is open.
            observer = connections.create_connection(DEFAULT_DB_ALIAS)
            try:
                with observer.cursor() as cursor:
                    cursor.execute("SELECT rows_done, status FROM catalog_ingestjob WHERE id = %s", [self.job_id])
                    seen.append(cursor.fetchone())
            finally:
                observer.close()
        else:
            job = selectors.ingest_job_of_team(team_id=owner.team.id, job_id=self.job_id)
            seen.append((job.rows_done, job.status))

    monkeypatch.setattr(services._JobProgress, "__call__", spy)
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl({"question": str(i)} for i in range(1000)))
    assert r.status_code == 200
    assert [rows for rows, _ in seen] == [100 * i for i in range(1, 11)]
    assert {status for _, status in seen} == {"running"}


def test_package_task_files_are_ingested_at_publish(owner):
    package = zip_bytes({"env.py": FILE_TASKS_ENV, "tasks/train.jsonl": jsonl(QUESTIONS),
                         "tasks/test.csv": "question,answer\nwhat,1\n"})
    r = publish(owner, "packaged", "p.zip", package)
    assert r.status_code == 201, r.json()
    assert r.json()["validation"]["prompt_checked"] is True  # on the first task of the files
    env = Environment.objects.get(slug="packaged")
    assert specs(env, "train") == QUESTIONS and specs(env, "test") == [{"question": "what", "answer": "1"}]


def test_a_bad_package_task_file_fails_publishing_with_line_numbers_and_publishes_nothing(owner, settings):
    package = zip_bytes({"env.py": FILE_TASKS_ENV, "tasks/train.jsonl": jsonl(QUESTIONS) + "[1]\n"})
    r = publish(owner, "packaged", "p.zip", package)
    assert r.status_code == 400 and r.json()["check"] == "tasks"
    assert "tasks/train.jsonl" in r.json()["detail"] and "line 6: expected a JSON object" in r.json()["traceback"]
    assert not Environment.objects.filter(slug="packaged").exists()
    assert stored_packages(settings) == []


def test_package_task_files_must_name_a_declared_split(owner):
    missing_name = zip_bytes({"env.py": FILE_TASKS_ENV, "tasks/.jsonl": jsonl(QUESTIONS)})
    r = publish(owner, "packaged", "p.zip", missing_name)
    assert r.status_code == 400 and r.json()["check"] == "tasks" and "split name is required" in r.json()["detail"]
    undeclared = zip_bytes({"env.py": FILE_TASKS_ENV, "tasks/extra.jsonl": jsonl(QUESTIONS)})
    r = publish(owner, "packaged", "p.zip", undeclared)
    assert r.status_code == 400 and "does not declare: extra" in r.json()["detail"]


def test_a_new_code_version_keeps_tasks_uploaded_earlier(owner):
    assert publish(owner, "quiz", "quiz.py", FILE_TASKS_ENV).status_code == 201
    quiz = Environment.objects.get(slug="quiz")
    upload_tasks(owner, "quiz", "train", "t.jsonl", jsonl(QUESTIONS), mode="replace")
    r = publish(owner, "quiz", "quiz.py", FILE_TASKS_ENV + "\n# version two\n")
    assert r.status_code == 201 and r.json()["number"] == 2
    assert specs(quiz, "train") == QUESTIONS


def test_task_specs_round_trip_unicode_and_nesting(owner, quiz):
    rows = [{"question": "¿Qué? 日本語 🎉", "answer": "\\n", "deep": {"a": [1, {"b": None}], "t": "\t"}}]
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", "\ufeff" + json.dumps(rows[0], ensure_ascii=False) + "\n")
    assert r.status_code == 200, r.json()
    assert specs(quiz, "train") == rows
