"""Training-data exports: JSONL (streamed) and Parquet, from the explorer and the REST API."""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.http import StreamingHttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext

from orsplatform.analytics import export
from tests.analytics.conftest import login


def jsonl_rows(response) -> list[dict]:
    assert response.status_code == 200, response.content
    assert isinstance(response, StreamingHttpResponse)
    return [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]


def parquet_rows(response) -> list[dict]:
    assert response.status_code == 200, response.content
    body = b"".join(response.streaming_content)
    assert body[:4] == b"PAR1" and int(response["Content-Length"]) == len(body)
    return pq.read_table(io.BytesIO(body)).to_pylist()


def test_the_jsonl_export_holds_task_spec_prompt_calls_and_rewards(seeded, owner):
    rows = jsonl_rows(login(owner).get("/analytics/acme/export.jsonl"))
    by_sid = {r["sid"]: r for r in rows}
    assert set(by_sid) == {*(f"acme-puzzle-{i}" for i in range(10)), "acme-test-0", "acme-test-1", "acme-open-0"}
    first = by_sid["acme-puzzle-0"]
    assert first["environment"] == "acme/puzzle" and first["version"] == 1 and first["split"] == "train"
    assert first["task_spec"] == {"question": "task 0 of train", "answer": "secret-answer-not-a-secret"}
    assert first["prompt"][0] == {"type": "text", "text": "Solve puzzle 0"}
    assert first["total_reward"] == 0.0 and first["finished"] is True and first["num_calls"] == 5
    assert [c["name"] for c in first["calls"]] == ["move"] * 4 + ["submit"]
    assert [c["latency_ms"] for c in first["calls"]] == [1, 2, 3, 4, 5]
    assert first["calls"][0]["output"]["output"]["blocks"] == [{"type": "text", "text": "result 0"}]
    assert sum(r["num_calls"] for r in rows) == 104
    assert by_sid["acme-puzzle-9"]["total_reward"] == 1.0
    # An open session's totals are its calls' so far.
    assert by_sid["acme-open-0"]["total_reward"] == 1.5 and by_sid["acme-open-0"]["num_calls"] == 2


def test_the_parquet_export_reads_back_with_pyarrow_as_the_same_records(seeded, owner):
    client = login(owner)
    rows = parquet_rows(client.get("/analytics/acme/export.parquet?environment=acme/puzzle"))
    jsonl = jsonl_rows(client.get("/analytics/acme/export.jsonl?environment=acme/puzzle"))
    assert [r["sid"] for r in rows] == [r["sid"] for r in jsonl] and len(rows) == 12
    first = rows[0]
    assert first["sid"] == "acme-puzzle-0" and first["total_reward"] == 0.0 and first["num_calls"] == 5
    assert json.loads(first["task_spec"]) == jsonl[0]["task_spec"]
    assert json.loads(first["prompt"])[1]["mimeType"] == "image/png"
    assert [c["latency_ms"] for c in first["calls"]] == [1, 2, 3, 4, 5]
    assert json.loads(first["calls"][4]["input"]) == {"step": 4}
    assert [r["total_reward"] for r in rows] == [0, 0, 0, 0.25, 0.5, 0.5, 1, 1, 1, 1, 1, 0]


def test_an_empty_export_is_an_empty_file_not_an_error(owner):
    client = login(owner)
    assert jsonl_rows(client.get("/analytics/acme/export.jsonl")) == []
    table = pq.read_table(io.BytesIO(b"".join(client.get("/analytics/acme/export.parquet").streaming_content)))
    assert table.num_rows == 0 and "calls" in table.column_names


def test_exports_apply_the_explorers_filters(seeded, owner):
    client = login(owner)
    passed = jsonl_rows(client.get("/analytics/acme/export.jsonl?reward_min=1&environment=acme/puzzle&version=1"))
    assert sorted(r["sid"] for r in passed) == [f"acme-puzzle-{i}" for i in range(6, 10)]
    assert [r["sid"] for r in jsonl_rows(client.get("/analytics/acme/export.jsonl?status=ready"))] == ["acme-open-0"]
    page = client.get("/analytics/acme/sessions/?reward_min=1&environment=acme/puzzle").content.decode()
    assert "export.jsonl?range=30d&amp;environment=acme%2Fpuzzle&amp;reward_min=1" in page


def test_the_export_reads_sessions_in_bounded_chunks(seeded, owner, monkeypatch):
    monkeypatch.setattr(export, "SESSION_CHUNK", 4)
    with CaptureQueriesContext(connection) as queries:
        rows = jsonl_rows(login(owner).get("/analytics/acme/export.jsonl"))
    assert len(rows) == 13
    # 13 sessions in chunks of 4: four session reads (the last one short) and four call reads.
    session_reads = [q for q in queries.captured_queries if 'FROM "episodes_session"' in q["sql"]
                     and "LIMIT 4" in q["sql"]]
    assert len(session_reads) == 4


def test_the_api_exports_with_an_api_key(seeded, owner):
    headers = {"HTTP_X_API_KEY": owner.token}
    rows = jsonl_rows(Client().get("/api/v1/analytics/export.jsonl?environment=acme/puzzle&version=2", **headers))
    assert [r["sid"] for r in rows] == ["acme-test-0", "acme-test-1"]
    table = parquet_rows(Client().get("/api/v1/analytics/export.parquet?environment=acme/puzzle&version=2", **headers))
    assert [r["sid"] for r in table] == ["acme-test-0", "acme-test-1"]
    assert Client().get("/api/v1/analytics/export.jsonl").status_code == 401


async def test_under_asgi_the_jsonl_export_streams_from_an_async_body(client, owner, monkeypatch):
    from tests.analytics.seed import seed

    def buffered(*args, **kwargs):
        raise AssertionError("Django's ASGI handler would buffer a sync body whole")

    monkeypatch.setattr(export, "_jsonl_sync", buffered)
    def seed_and_close() -> None:
        # sync_to_async runs this on asgiref's shared thread; its connection would outlive the test
        # and keep PostgreSQL from dropping the test database.
        try:
            seed(acme=owner.team)
        finally:
            connections.close_all()

    await sync_to_async(seed_and_close)()
    async with client.stream("GET", "/api/v1/analytics/export.jsonl", headers=owner.headers) as response:
        assert response.status_code == 200
        lines = [json.loads(line) async for line in response.aiter_lines() if line]
    assert len(lines) == 13 and lines[0]["sid"] == "acme-puzzle-0"



def test_each_exported_session_says_which_protocol_opened_it(seeded, owner):
    from orsplatform.episodes.models import Session

    Session.objects.filter(sid="acme-test-1").update(protocol=Session.Protocol.OPENENV)
    for fmt, read in (("jsonl", jsonl_rows), ("parquet", parquet_rows)):
        by_sid = {r["sid"]: r for r in read(login(owner).get(f"/analytics/acme/export.{fmt}"))}
        assert by_sid["acme-test-1"]["protocol"] == "openenv", fmt
        assert by_sid["acme-test-0"]["protocol"] == "ors", fmt
