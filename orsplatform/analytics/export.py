"""Training-data export: one record per session with its task spec, prompt, calls and rewards, as
JSONL (streamed) or Parquet (written in record batches to a temporary file, then streamed).

Memory stays bounded by one chunk of sessions whatever the export size. Sessions are read in keyset
chunks (id > last id) rather than through one long server-side cursor: under ASGI the generator
resumes on whatever thread sync_to_async picks and the request's connection may be closed between
chunks, so each chunk is an independent short query; the calls of a chunk are read with
.iterator(chunk_size=...) inside it.

Django's ASGI handler buffers a *synchronous* streaming body completely before sending it, so the
response body is an async iterator when served under ASGI (daphne, uvicorn) and a plain iterator
under WSGI and the test client.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone

from orsplatform.analytics.filters import SessionFilters
from orsplatform.analytics.selectors import OPEN
from orsplatform.auditlog.selectors import calls_of_sessions
from orsplatform.catalog.hidden import session_spec
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.models import Team

SESSION_CHUNK = 500
CALL_CHUNK = 2_000
FILE_BLOCK = 64 * 1024


def _latency_ms(call: ToolCall) -> float | None:
    return (call.finished_at - call.started_at).total_seconds() * 1000 if call.finished_at else None


def export_record(session: Session, calls: list[ToolCall], sealed_reader: int | None) -> dict[str, Any]:
    """A session's record; a sealed split's task spec is None unless the viewer reads the
    environment's sealed specs (catalog/hidden.py: `sealed_reader`)."""
    is_open = session.status in OPEN
    rewards = [c.reward for c in calls if c.reward is not None]
    return {
        "sid": session.sid,
        "environment": session.environment.full_name,
        "version": session.version.number,
        "split": session.split,
        "task_index": session.task_index,
        "sealed": session.sealed,
        "task_spec": session_spec(session.task_spec, sealed=session.sealed,
                                  environment_team_id=session.environment.team_id, reader=sealed_reader),
        "prompt": session.prompt,
        "status": session.status,
        "protocol": session.protocol,
        "api_key": session.api_key.prefix if session.api_key_id else None,
        "created_at": session.created_at,
        "ended_at": session.ended_at,
        # An open session's totals are only written when it ends; until then they are the calls'.
        "total_reward": (sum(rewards) if rewards else None) if is_open else session.total_reward,
        "finished": any(c.finished for c in calls) if is_open else session.finished,
        "num_calls": len(calls),
        # Some of its calls were read back from the archive (docs/audit-log.md).
        "archived": any(getattr(c, "archived", False) for c in calls),
        "calls": [
            {"step": i + 1, "name": c.name, "input": c.input, "status": c.status, "output": c.output,
             "reward": c.reward, "finished": c.finished, "error": c.error, "started_at": c.started_at,
             "finished_at": c.finished_at, "latency_ms": _latency_ms(c)}
            for i, c in enumerate(calls)
        ],
    }


def _sessions(team: Team, filters: SessionFilters, sealed_reader: int | None):
    return (filters.apply(Session.objects.filter(team=team), sealed_reader=sealed_reader)
            .select_related("environment__team", "version", "api_key").order_by("id"))


def fetch_chunk(*, team: Team, filters: SessionFilters, after_id: int,
                sealed_reader: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """The records of the next SESSION_CHUNK sessions after after_id, and the id to continue from
    (None when done)."""
    sessions = list(_sessions(team, filters, sealed_reader).filter(id__gt=after_id)[:SESSION_CHUNK])
    if not sessions:
        return [], None
    # From the database, and from the archive for days that left it (auditlog/selectors.py).
    calls = calls_of_sessions(sessions)
    records = [export_record(s, calls.get(s.id, []), sealed_reader) for s in sessions]
    return records, (sessions[-1].id if len(sessions) == SESSION_CHUNK else None)


def iter_records(*, team: Team, filters: SessionFilters, sealed_reader: int | None) -> Iterator[list[dict[str, Any]]]:
    after: int | None = 0
    while after is not None:
        records, after = fetch_chunk(team=team, filters=filters, after_id=after, sealed_reader=sealed_reader)
        if records:
            yield records


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r, default=str, option=orjson.OPT_UTC_Z) + b"\n" for r in records)


def _jsonl_sync(team: Team, filters: SessionFilters, sealed_reader: int | None) -> Iterator[bytes]:
    for records in iter_records(team=team, filters=filters, sealed_reader=sealed_reader):
        yield _jsonl(records)


async def _jsonl_async(team: Team, filters: SessionFilters, sealed_reader: int | None) -> AsyncIterator[bytes]:
    fetch = sync_to_async(fetch_chunk)
    after: int | None = 0
    while after is not None:
        records, after = await fetch(team=team, filters=filters, after_id=after, sealed_reader=sealed_reader)
        if records:
            yield _jsonl(records)


def _filename(team: Team, extension: str) -> str:
    return f"{team.slug}-sessions-{timezone.now():%Y%m%dT%H%M%SZ}.{extension}"


def jsonl_response(request: HttpRequest, *, team: Team, filters: SessionFilters,
                   sealed_reader: int | None) -> StreamingHttpResponse:
    content = (_jsonl_async(team, filters, sealed_reader) if isinstance(request, ASGIRequest)
               else _jsonl_sync(team, filters, sealed_reader))
    response = StreamingHttpResponse(content, content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="{_filename(team, "jsonl")}"'
    response["X-Accel-Buffering"] = "no"  # let a fronting nginx pass the stream through
    return response


def parquet_schema():
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    call = pa.struct([
        ("step", pa.int32()), ("name", pa.string()),
        # Inputs and outputs are free-form JSON per tool, so they travel as JSON text.
        ("input", pa.string()), ("status", pa.string()), ("output", pa.string()), ("reward", pa.float64()),
        ("finished", pa.bool_()), ("error", pa.string()), ("started_at", ts), ("finished_at", ts),
        ("latency_ms", pa.float64()),
    ])
    return pa.schema([
        ("sid", pa.string()), ("environment", pa.string()), ("version", pa.int32()), ("split", pa.string()),
        ("task_index", pa.int64()), ("sealed", pa.bool_()), ("task_spec", pa.string()), ("prompt", pa.string()), ("status", pa.string()),
        ("protocol", pa.string()), ("api_key", pa.string()), ("created_at", ts), ("ended_at", ts), ("total_reward", pa.float64()),
        ("finished", pa.bool_()), ("num_calls", pa.int64()), ("calls", pa.list_(call)),
    ])


def _json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value, default=str).decode()


def _parquet_row(record: dict[str, Any]) -> dict[str, Any]:
    return {
        **record,
        "task_spec": _json_text(record["task_spec"]),
        "prompt": _json_text(record["prompt"]),
        "calls": [{**c, "input": _json_text(c["input"]), "output": _json_text(c["output"])} for c in record["calls"]],
    }


def write_parquet(*, team: Team, filters: SessionFilters, path: str, sealed_reader: int | None) -> int:
    """Write the export to a Parquet file one record batch per chunk; returns the sessions written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    written = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for records in iter_records(team=team, filters=filters, sealed_reader=sealed_reader):
            writer.write_batch(pa.RecordBatch.from_pylist([_parquet_row(r) for r in records], schema=schema))
            written += len(records)
        if written == 0:
            writer.write_table(schema.empty_table())
    return written


def _file_sync(handle) -> Iterator[bytes]:
    try:
        while block := handle.read(FILE_BLOCK):
            yield block
    finally:
        handle.close()


async def _file_async(handle) -> AsyncIterator[bytes]:
    try:
        while block := await asyncio.to_thread(handle.read, FILE_BLOCK):
            yield block
    finally:
        handle.close()


def parquet_response(request: HttpRequest, *, team: Team, filters: SessionFilters,
                     sealed_reader: int | None) -> StreamingHttpResponse:
    fd, path = tempfile.mkstemp(prefix="ors-export-", suffix=".parquet")
    os.close(fd)
    try:
        write_parquet(team=team, filters=filters, path=path, sealed_reader=sealed_reader)
        handle = open(path, "rb")  # noqa: SIM115 - closed by the response body generator
    finally:
        # Unlinked at once: the open handle keeps the data readable, and nothing is left behind
        # on disk if the client goes away mid-download.
        os.unlink(path)
    size = os.fstat(handle.fileno()).st_size
    content = _file_async(handle) if isinstance(request, ASGIRequest) else _file_sync(handle)
    response = StreamingHttpResponse(content, content_type="application/vnd.apache.parquet")
    response["Content-Length"] = str(size)
    response["Content-Disposition"] = f'attachment; filename="{_filename(team, "parquet")}"'
    return response
