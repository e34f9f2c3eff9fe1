"""POST /{env}/call: run a tool and stream its result over SSE.

The call runs as its own task, not inside the request: a client that disconnects mid-call does not
cancel it, its audit row is still written, and a reconnect with the same task_id gets its result.
The result is recorded in the audit log before any client can see it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from django.conf import settings
from django.utils import timezone

from orsplatform.episodes.models import ToolCall
from orsplatform.ors.http import SSE_HEADERS, SSE_PING, HttpError, Request, sse_event
from orsplatform.ors.sessions import CallEntry, LiveSession
from orsplatform.ors.wire import optional_str, require_str
from orsplatform.runners.executor import CallOutcome, UnknownSession
from orsplatform.runners.redact import redact
from orsplatform.teams.auth import Caller

if TYPE_CHECKING:
    from orsplatform.ors.app import OrsApp

log = logging.getLogger("orsplatform.ors")
CHUNK = 4096
TASK_ID_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


async def call(app: OrsApp, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = await app.live_session(req, caller, env_ref)
    body = req.json()
    task_id = optional_str(body, "task_id")
    if task_id is not None:
        entry = live.calls.get(task_id) or (
            await _entry_from_audit(app, live, task_id) if TASK_ID_RE.match(task_id) else None)
        await _stream(req, entry, task_id)
        return None
    name = require_str(body, "name")
    tool_input = body.get("input", {})
    if not isinstance(tool_input, dict):
        raise HttpError(400, "'input' must be a JSON object")
    await app.limits.take_call_token(caller.team_id, caller.max_tool_calls_per_second)
    await app.ready(live)
    entry = CallEntry(task_id=uuid.uuid4().hex)
    live.calls[entry.task_id] = entry
    entry.task = app.spawn(_run(app, live, entry, name, tool_input))
    await _stream(req, entry, entry.task_id)
    return None


async def _run(app: OrsApp, live: LiveSession, entry: CallEntry, name: str, tool_input: dict) -> None:
    # Whatever happens below, the waiting stream must end: `done` is set in the finally.
    recorded = False
    try:
        started_at = timezone.now()
        audit_input = storable(redact(tool_input, live.secrets))
        # Shared executors keep the running call findable by other gateways (reconnects) and by
        # the sweeper that records it should this gateway die; the audit row is written once, below.
        note = {"sid": live.sid, "session_pk": live.pk, "name": name, "input": audit_input,
                "started_at": started_at.isoformat()}
        outcome, encoded = await _execute(app, live, name, tool_input, entry.task_id, note)
        live.count_call(outcome.result)
        # The audit log's copy: secrets stripped (by the executor that holds them, or here);
        # NUL characters (which PostgreSQL cannot store) replaced only when the encoded result
        # shows one, so an ordinary call is not walked.
        audit_result = outcome.audit if outcome.audit is not None else redact(outcome.result, live.secrets)
        if encoded is not None and b"\\u0000" in encoded:
            audit_result = storable(audit_result)
        try:
            await app.store.tool_call_record(
                session_pk=live.pk, task_id=entry.task_id, name=storable(name),
                input=audit_input if outcome.audit_input is None else storable(outcome.audit_input),
                result=audit_result, exception=storable(outcome.exception), started_at=started_at,
                finished_at=timezone.now(),
            )
            recorded = True
        except Exception:
            log.exception("could not record tool call %s of session %s", entry.task_id, live.sid)
        entry.result_json = encoded.decode() if encoded is not None else None
        entry.exception = outcome.exception
    except Exception as exc:
        log.exception("tool call %s of session %s failed in the platform", entry.task_id, live.sid)
        entry.exception = f"The platform could not complete the call ({type(exc).__name__})."
    finally:
        entry.finished_at = time.monotonic()
        live.touch()
        entry.done.set()
    if recorded:
        # After the stream is woken: the client does not wait for this clean-up.
        try:
            await app.executor.forget_call(entry.task_id)
        except Exception as exc:  # the marker expires on its own; the sweeper finds the row written
            log.warning("could not drop the marker of call %s: %s", entry.task_id, exc)


async def _execute(app: OrsApp, live: LiveSession, name: str, tool_input: dict, task_id: str,
                   note: dict) -> tuple[CallOutcome, bytes | None]:
    """The call's outcome and its result encoded once for the wire (None without a result)."""
    try:
        outcome = await app.executor.call(live.sid, name, tool_input, live.env.tool_timeout, task_id, note)
    except UnknownSession:
        return CallOutcome(exception="Session was deleted during the call."), None
    if outcome.result is None:
        return outcome, None
    try:
        return outcome, orjson.dumps(outcome.result)
    except (TypeError, orjson.JSONEncodeError) as exc:
        # e.g. a lone surrogate in a text block: the result cannot go on the wire or in the log.
        return CallOutcome(exception=f"The tool's result is not valid JSON: {exc}"), None


def storable(value: Any) -> Any:
    """The audit log's copy without NUL characters, which PostgreSQL cannot store in text or JSON
    (the client still gets the result exactly as the environment produced it)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def _encode(outcome: CallOutcome) -> tuple[str | None, str | None]:
    if outcome.result is None:
        return None, outcome.exception
    return orjson.dumps(outcome.result).decode(), outcome.exception


async def _entry_from_audit(app: OrsApp, live: LiveSession, task_id: str) -> CallEntry | None:
    row = await app.store.tool_call_result(live.pk, task_id)
    if row is None:
        running = await app.executor.call_record(task_id)
        if running is None or running.get("sid") != live.sid:
            return None
        # Still running, started on another gateway: wait for the runner's result like it does.
        entry = CallEntry(task_id=task_id)
        entry.task = app.spawn(_follow(app, live, entry))
        return entry
    status, result, error = row
    entry = CallEntry(task_id=task_id)
    if status == ToolCall.Status.RUNNING:
        entry.exception = "The call was interrupted."
    elif result is not None:
        entry.result_json = orjson.dumps(result).decode()
    else:
        entry.exception = error or "The call failed."
    entry.done.set()
    return entry


async def _follow(app: OrsApp, live: LiveSession, entry: CallEntry) -> None:
    try:
        outcome = await app.executor.wait_result(entry.task_id, live.runner, live.env.tool_timeout)
        entry.result_json, entry.exception = _encode(outcome)
    except Exception as exc:
        entry.exception = f"The platform could not follow the call ({type(exc).__name__})."
    finally:
        entry.finished_at = time.monotonic()
        entry.done.set()


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _stream(req: Request, entry: CallEntry | None, task_id: str) -> None:
    req.started = True
    await req.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    if entry is None:
        await req.send({"type": "http.response.body", "body": sse_event("error", "unknown task_id")})
        return
    await req.send({"type": "http.response.body", "body": sse_event("task_id", task_id), "more_body": True})
    if not entry.done.is_set():
        disconnected = asyncio.ensure_future(_wait_disconnect(req.receive))
        finished = asyncio.ensure_future(entry.done.wait())
        try:
            while not entry.done.is_set():
                done, _ = await asyncio.wait({finished, disconnected}, timeout=settings.ORS_SSE_PING_SECONDS,
                                             return_when=asyncio.FIRST_COMPLETED)
                if disconnected in done:
                    return  # the call goes on; its result waits for a reconnect
                if not done:
                    await req.send({"type": "http.response.body", "body": SSE_PING, "more_body": True})
        finally:
            disconnected.cancel()
            finished.cancel()
    if entry.exception is not None:
        await req.send({"type": "http.response.body", "body": sse_event("error", entry.exception)})
        return
    data = entry.result_json or ""
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
    events = [sse_event("chunk", p) for p in pieces[:-1]] + [sse_event("end", pieces[-1])]
    await req.send({"type": "http.response.body", "body": b"".join(events)})
