"""Task uploads run a sample of their rows through the environment the way a session starts (setup()
and get_prompt(), in the sandbox): a row with ``txt`` where the code reads ``row["text"]`` is refused
at upload naming its row, its line, the field and the author's own traceback, or accepted with
warnings when the author says so; both ingest paths (REST, console), JSONL and Parquet; hidden and
sealed values never reach the report. Real sandboxed children, real PostgreSQL."""

from __future__ import annotations

import io
import random
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from orsplatform.catalog.models import Environment, IngestJob, Split
from orsplatform.catalog.protection import split_protection_set
from orsplatform.catalog.row_check import Sampler
from tests.catalog.support import api, jsonl, login, publish, upload_tasks

READER_ENV = textwrap.dedent('''
    from ors import Environment, Split, TextBlock, ToolOutput, tool


    class Reader(Environment):
        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            raise NotImplementedError

        def setup(self):
            self.words = self.task_spec["text"].split()

        def get_prompt(self):
            if self.task_spec.get("boom"):
                raise ValueError("cannot read " + str(self.task_spec["answer"]))
            return [TextBlock(text=" ".join(self.words))]

        @tool
        def done(self) -> ToolOutput:
            """Finish."""
            return ToolOutput(blocks=[TextBlock(text="bye")], reward=1.0, finished=True)
''')

GOOD = [{"text": "one two"}, {"text": "three"}]
TYPO = [*GOOD, {"txt": "four"}]


def _published(owner) -> None:
    r = publish(owner, "reader", "env.py", READER_ENV)
    assert r.status_code == 201, r.json()


def _parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def _num_tasks(name: str = "train") -> int:
    split = Split.objects.filter(environment__slug="reader", name=name).first()
    return split.num_tasks if split else 0


def test_a_row_missing_the_field_the_code_reads_is_refused_naming_row_field_and_the_authors_traceback(
        owner, member, outsider, settings):
    _published(owner)
    r = upload_tasks(owner, "reader", "train", "tasks.jsonl", jsonl(TYPO))
    assert r.status_code == 400, r.json()
    body = r.json()
    assert body["check"] == "rows" and body["sampled"] == 3 and "no task was written" in body["detail"]
    [failure] = body["errors"]
    assert failure["row"] == 2 and failure["line"] == 3 and failure["field"] == "text"
    assert failure["error"].startswith("KeyError: 'text'") and "the row has 'txt'" in failure["error"]
    # The author's own frame (setup(), the line that reads the field), nothing of the platform's.
    assert 'File "env.py", line' in failure["traceback"] and 'self.task_spec["text"]' in failure["traceback"]
    assert "in setup" in failure["traceback"]
    for foreign in ("orsplatform", "site-packages", str(settings.BASE_DIR), "/ors/"):
        assert foreign not in failure["traceback"]
    assert _num_tasks() == 0
    assert body["job"]["status"] == "failed" and body["job"]["row_check"] == {}

    # Tenancy: a sessions key of the team may not upload, another team's key finds nothing.
    assert upload_tasks(member, "reader", "train", "tasks.jsonl", jsonl(TYPO)).status_code == 403
    assert upload_tasks(outsider, "reader", "train", "tasks.jsonl", jsonl(TYPO), team="acme").status_code == 404
    # The job's report is the team's: another team's key cannot read it.
    job_id = body["job"]["id"]
    assert api(outsider).get(f"/api/v1/ingest-jobs/{job_id}").status_code == 404
    assert api(member).get(f"/api/v1/ingest-jobs/{job_id}").json()["error_report"]["errors"][0]["field"] == "text"


def test_the_author_may_accept_failing_rows_and_gets_them_as_warnings(owner):
    _published(owner)
    r = upload_tasks(owner, "reader", "train", "tasks.jsonl", jsonl(TYPO), accept_failing_rows="true")
    assert r.status_code == 200, r.json()
    job = r.json()
    assert job["status"] == "succeeded" and job["accept_failing_rows"] is True
    assert job["row_check"]["sampled"] == 3 and job["row_check"]["failed"] == 1
    assert job["row_check"]["failures"][0]["row"] == 2 and job["row_check"]["failures"][0]["field"] == "text"
    assert _num_tasks() == 3


def test_rows_that_all_start_pass_and_say_so(owner):
    _published(owner)
    r = upload_tasks(owner, "reader", "train", "tasks.jsonl", jsonl(GOOD))
    assert r.status_code == 200, r.json()
    assert r.json()["row_check"] == {"sampled": 2, "failed": 0, "failures": []}
    # Appended rows are numbered as the tasks they become.
    r = upload_tasks(owner, "reader", "train", "more.jsonl", jsonl([{"text": "x"}, {"txt": "y"}]))
    assert r.status_code == 400 and r.json()["errors"][0]["row"] == 3 and r.json()["errors"][0]["line"] == 2
    assert _num_tasks() == 2


def test_a_parquet_upload_through_the_console_is_checked_and_the_checkbox_accepts_it(owner, member, outsider):
    _published(owner)
    web = login(owner)
    form = {"environment": str(Environment.objects.get(slug="reader").id), "split": "train", "mode": "append",
            "format": ""}
    # A Parquet file has one schema: a column named "txt" in every row.
    typos = [{"txt": "one two"}, {"txt": "three"}]
    r = web.post("/console/acme/environments/tasks", {**form, "file": SimpleUploadedFile("t.parquet", _parquet(typos))})
    assert r.status_code == 302
    page = web.get(r["Location"]).content.decode()
    assert "row 0" in page and "(line 1)" in page and "row 1" in page and '<code class="row-field">text</code>' in page
    assert "KeyError" in page and 'File &quot;env.py&quot;' in page and _num_tasks() == 0
    assert IngestJob.objects.get(id=int(r["Location"].rstrip("/").split("/")[-1])).status == "failed"
    # Others: a member sees the team's job page, another team nothing.
    assert login(member).get(r["Location"]).status_code == 200
    assert login(outsider).get(r["Location"]).status_code == 404

    r = web.post("/console/acme/environments/tasks", {**form, "accept_failing_rows": "on",
                                                        "file": SimpleUploadedFile("t.parquet", _parquet(typos))})
    page = web.get(r["Location"]).content.decode()
    assert "2 of the 2 rows run through the environment failed" in page and "accepted as warnings" in page
    assert _num_tasks() == 2


def test_hidden_and_sealed_values_never_reach_the_report(owner, viewer):
    _published(owner)
    assert upload_tasks(owner, "reader", "train", "t.jsonl", jsonl(GOOD)).status_code == 200
    split = Split.objects.get(environment__slug="reader", name="train")
    split_protection_set(split=split, hidden_fields=["answer"], sealed=False)
    rows = [{"text": "a", "answer": "SECRET-ANSWER-42", "boom": True}]
    r = upload_tasks(owner, "reader", "train", "t.jsonl", jsonl(rows))
    assert r.status_code == 400
    failure = r.json()["errors"][0]
    assert "SECRET-ANSWER-42" not in r.content.decode() and "cannot read [hidden]" in failure["error"]
    job = api(viewer).get(f"/api/v1/ingest-jobs/{r.json()['job']['id']}")
    assert job.status_code == 200 and "SECRET-ANSWER-42" not in job.content.decode()

    # Sealed: every value of the row is blanked, and the row's field names are not offered as hints.
    split_protection_set(split=split, hidden_fields=[], sealed=True)
    rows = [{"txt": "PRIVATE-WORDING-7"}]
    r = upload_tasks(owner, "reader", "train", "t.jsonl", jsonl(rows))
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "text", r.json()
    assert "PRIVATE-WORDING-7" not in r.content.decode() and "the row has" not in r.content.decode()


def test_the_first_row_is_always_checked_and_the_sample_is_bounded_by_the_setting(owner, settings):
    settings.ORS_TASK_CHECK_ROWS = 3
    _published(owner)
    rows = [{"txt": "bad first"}] + [{"text": f"w{i}"} for i in range(60)]
    r = upload_tasks(owner, "reader", "train", "t.jsonl", jsonl(rows))
    assert r.status_code == 400 and r.json()["sampled"] == 3 and r.json()["errors"][0]["row"] == 0
    settings.ORS_TASK_CHECK_ROWS = 0  # no check: the file goes in as it is
    r = upload_tasks(owner, "reader", "train", "t.jsonl", jsonl(rows))
    assert r.status_code == 200 and r.json()["row_check"] == {} and _num_tasks() == 61


def test_the_sampler_keeps_the_first_row_and_a_uniform_sample_of_the_rest():
    counts = [0] * 100
    for seed in range(400):
        sampler = Sampler(size=5, rng=random.Random(seed))
        for position in range(100):
            sampler(position, position + 1, b"{}")
        rows = sampler.rows()
        assert len(rows) == 5 and rows[0][0] == 0 and len({r[0] for r in rows}) == 5
        for position, _, _ in rows[1:]:
            counts[position] += 1
    # 400 draws of 4 among 99 rows: about 16 each; none never, none far more often.
    assert counts[0] == 0 and min(counts[1:]) > 0 and max(counts[1:]) < 50
    small = Sampler(size=20)
    for position in range(3):
        small(position, position + 1, b"{}")
    assert [r[0] for r in small.rows()] == [0, 1, 2]


def test_the_cli_refuses_failing_rows_and_its_flag_accepts_them(owner, tmp_path):
    _published(owner)
    path = tmp_path / "tasks.jsonl"
    path.write_text(jsonl(TYPO))
    err = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("upload_tasks", "acme/reader", "train", str(path), stderr=err)
    assert "no task was written" in str(failure.value)
    assert "row 2 (line 3), field 'text': KeyError: 'text'" in err.getvalue() and _num_tasks() == 0
    out, err = io.StringIO(), io.StringIO()
    call_command("upload_tasks", "acme/reader", "train", str(path), "--accept-failing-rows", stdout=out, stderr=err)
    assert "3 task(s) added" in out.getvalue() and err.getvalue().startswith("warning: row 2 (line 3)")
    assert _num_tasks() == 3
    with pytest.raises(CommandError):
        call_command("upload_tasks", "globex/reader", "train", str(path))
