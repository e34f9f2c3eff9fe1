"""POST /{env}/call: a tool call, its result streamed over SSE (the call itself runs in the
gateway, engine/calls.py, and outlives a client that disconnects)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from django.conf import settings

from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.engine.live import CallEntry
from orsplatform.ors.http import SSE_HEADERS, SSE_PING, HttpError, Request, sse_event
from orsplatform.ors.resolve import admitted_session
from orsplatform.ors.wire import optional_str, require_sid, require_str
from orsplatform.teams.auth import Caller

CHUNK = 4096
TASK_ID_RE = re.compile(r"^[A-Za-z0-9-]{1,64}$")


async def call(gw: EpisodeGateway, req: Request, caller: Caller, env_ref: str | None) -> Any:
    live = admitted_session(caller, await gw.session(caller, require_sid(req), env_ref))
    body = req.json()
    task_id = optional_str(body, "task_id")
    if task_id is not None:
        entry = await gw.call_entry(live, task_id) if TASK_ID_RE.match(task_id) else None
        await _stream(req, entry, task_id)
        return None
    name = require_str(body, "name")
    tool_input = body.get("input", {})
    if not isinstance(tool_input, dict):
        raise HttpError(400, "'input' must be a JSON object")
    entry = await gw.start_call(caller, live, name, tool_input)
    await _stream(req, entry, entry.task_id)
    return None


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
    data = entry.result_json().decode()
    pieces = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [""]
    events = [sse_event("chunk", p) for p in pieces[:-1]] + [sse_event("end", pieces[-1])]
    await req.send({"type": "http.response.body", "body": b"".join(events)})
