"""An AAP agent server of version 2 or 3 for the evaluation tests, in its own process over real HTTP
and SSE, shaped as the official TypeScript SDK's server sends and expects (agentapplicationprotocol/
typescript-sdk, packages/server/src/server.ts: 0.6.x for version 2, 0.8.0 for version 3).

    python tests/evals/aap_sdk_agent.py --port 8765 --version 3 [--api-key KEY]

Version 3 (SDK 0.8.0): `GET /meta` says `"version": 3` with tool specs' `parameters`;
`POST /sessions` → 201 `{sessionId}` and runs nothing; `POST /sessions/:id/turns` (404 for an
unknown session); `DELETE /sessions/:id` → 204 or 404; `GET /sessions/:id`, `GET /sessions/:id/history
?type=compacted|full`, `GET /sessions` (objects, `next`); no `session_start`. Version 2 (SDK 0.6):
`PUT /session` (the last message must be a user one; 201 with the turn in "none"), `POST /session/:id`,
`DELETE /session/:id`, streams opening with `session_start`, `GET /session/:id/history`, `GET
/sessions` (objects, `next`); tool specs' `inputSchema`. Both read images as `{type: "image", url}`:
an image block without `url` makes the agent fail its turn (HTTP 500), as it does an SDK agent.

Agents: `solver` answers the bundled `math` tasks like tests/evals/aap_agent.py's (the same one in
three wrong); `seer` answers `vision` tasks from the pixels of the image it was sent (the zoomed
image first, when the task offers `zoom`); `hasty` is the solver behind a server that closes
streamed turns before their last event, as the SDK's 0.8.0 server can (it writes events without
awaiting them). GET /_stats tells what the server saw.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import json
import struct
import sys
import uuid
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aap_agent import ANSWERS, fails, question_of  # noqa: E402  (the v1 agent's math answers)

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ("solver", "seer", "hasty")
VERSION = 3
API_KEY = ""
SESSIONS: dict[str, dict] = {}
STATS: dict = {}


def _reset() -> None:
    SESSIONS.clear()
    STATS.clear()
    STATS.update(created=0, deleted=0, open=0, turns=0, tool_spec_keys=[], images=[], image_failures=0,
                 first_messages=[], paths=[], auth=[])


_reset()


def _palette() -> dict[tuple[int, int, int], str]:
    # envs/vision/env.py (plain ors-sdk code) under a name of its own: the math answers load
    # envs/math/env.py as `env`.
    spec = importlib.util.spec_from_file_location("vision_env", ROOT / "envs" / "vision" / "env.py")
    vision_env = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vision_env)
    return {rgb: name for name, rgb in vision_env.PALETTE.items()}


PALETTE = _palette()


def colour_of_png(png: bytes) -> str:
    """The palette colour of the first pixel that is not the background, in an 8-bit RGB PNG with
    filter 0 rows (as envs/vision draws them)."""
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, tag = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if tag == b"IHDR":
            width = struct.unpack(">I", data[:4])[0]
        elif tag == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    for row in range(len(raw) // stride):
        line = raw[row * stride + 1:(row + 1) * stride]
        for col in range(width):
            rgb = tuple(line[3 * col:3 * col + 3])
            if rgb in PALETTE:
                return PALETTE[rgb]
    return "none"


def tool_spec(name: str, description: str, schema: dict) -> dict:
    return {"name": name, "description": description,
            ("parameters" if VERSION >= 3 else "inputSchema"): schema}


def meta() -> dict:
    agents = [{"name": name, "title": name.title(), "version": "0.8.0" if VERSION >= 3 else "0.6.1",
               "description": f"SDK-shaped test agent ({name}).",
               "tools": [tool_spec("web_search", "Search the web",
                                   {"type": "object", "properties": {"query": {"type": "string"}}})],
               "options": [{"name": "model", "type": "secret", "default": ""}],
               "capabilities": {"stream": {"delta": {}, "message": {}, "none": {}}, "application": {"tools": {}},
                                "image": {"data": {}}, "history": {"full": {}}}}
              for name in AGENTS]
    return {"version": VERSION, "agents": agents}


class AgentCrash(Exception):
    """What an SDK agent does with content it cannot read: its turn fails (HTTP 500)."""


def _images(content) -> list[bytes]:
    """The images of a message's content, read the SDK's way (`url` only)."""
    found = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "image":
            STATS["images"].append(sorted(block))
            url = block.get("url")
            if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
                STATS["image_failures"] += 1
                raise AgentCrash("TypeError: Cannot read properties of undefined (reading 'startsWith')")
            found.append(base64.b64decode(url.partition(";base64,")[2]))
    return found


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def script(session: dict, messages: list[dict]) -> list[dict]:
    """The events of this turn (turn_stop last)."""
    session["turns"] += 1
    session["history"].extend(messages)
    call = f"call_{uuid.uuid4().hex[:8]}"
    for message in messages:
        for image in _images(message.get("content")):
            session["image"] = image  # the latest image the agent saw (the prompt's, then the zoomed one)
    if session["turns"] == 1:
        if session["agent"] == "seer":
            if "zoom" in session["tools"]:
                return [{"event": "text", "text": "Let me look closer."},
                        {"event": "tool_call", "toolCallId": call, "name": "zoom", "input": {"factor": 2}},
                        {"event": "turn_stop", "stopReason": "tool_use"}]
            return _answer_colour(session, call)
        question = question_of(_text_of(messages[-1]["content"]))
        answer = ANSWERS.answer(question)
        if fails(question):
            answer = str(int(answer) + 1)
        return [{"event": "thinking", "thinking": f"The question asks: {question[:40]}"},
                {"event": "text", "text": f"My answer is {answer}."},
                {"event": "tool_call", "toolCallId": call, "name": "submit", "input": {"answer": answer}},
                {"event": "turn_stop", "stopReason": "tool_use"}]
    if session["agent"] == "seer" and session["turns"] == 2:
        return _answer_colour(session, call)
    return [{"event": "text", "text": "Done."}, {"event": "turn_stop", "stopReason": "end_turn"}]


def _answer_colour(session: dict, call: str) -> list[dict]:
    colour = colour_of_png(session["image"]) if session.get("image") else "none"
    return [{"event": "text", "text": f"The square is {colour}."},
            {"event": "tool_call", "toolCallId": call, "name": "answer", "input": {"colour": colour}},
            {"event": "turn_stop", "stopReason": "tool_use"}]


def _frame(event: dict) -> bytes:
    data = {k: v for k, v in event.items() if k != "event"}
    return f"event: {event['event']}\ndata: {json.dumps(data)}\n\n".encode()


async def _sse(session: dict, events: list[dict], mode: str, first: bool) -> AsyncIterator[bytes]:
    if first and VERSION < 3:
        yield _frame({"event": "session_start", "sessionId": session["id"]})
    yield _frame({"event": "turn_start"})
    for event in events:
        if event["event"] == "turn_stop" and session["agent"] == "hasty":
            # The SDK 0.8.0 server's handler returned before its un-awaited writes of the turn's
            # last event were flushed: the stream closes without turn_stop.
            return
        kind = event["event"]
        if mode == "delta" and kind in ("text", "thinking"):
            for i in range(0, len(event[kind]), 8):
                yield _frame({"event": f"{kind}_delta", "delta": event[kind][i:i + 8]})
                await asyncio.sleep(0)
            continue
        yield _frame(event)


def _none_reply(events: list[dict]) -> dict:
    blocks, stop = [], "end_turn"
    for event in events:
        kind = event["event"]
        if kind in ("text", "thinking"):
            blocks.append({"type": kind, kind: event[kind]})
        elif kind == "tool_call":
            blocks.append({"type": "tool_use", **{k: v for k, v in event.items() if k != "event"}})
        elif kind == "turn_stop":
            stop = event["stopReason"]
    return {"stopReason": stop, "messages": [{"role": "assistant", "content": blocks}]}


def _unauthorized(request: Request) -> Response | None:
    STATS["auth"].append(request.headers.get("authorization", ""))
    STATS["paths"].append(f"{request.method} {request.url.path}")
    if API_KEY and request.headers.get("authorization") != f"Bearer {API_KEY}":
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    return None


def _new_session(body: dict) -> dict | Response:
    agent = body.get("agent") or {}
    if agent.get("name") not in AGENTS:
        return JSONResponse({"error": f"no agent {agent.get('name')!r}"}, status_code=404)
    tools = body.get("tools") or []
    for tool in tools:
        STATS["tool_spec_keys"].append(sorted(tool))
        schema_key = "parameters" if VERSION >= 3 else "inputSchema"
        if not isinstance(tool.get(schema_key), dict):
            # The SDK hands `parameters` (v3) to its model provider as the tool's JSON schema.
            return JSONResponse({"error": f"tool {tool.get('name')!r} has no {schema_key}"}, status_code=500)
    session = {"id": f"{int(asyncio.get_running_loop().time() * 1000)}-{uuid.uuid4().hex[:6]}",
               "agent": agent["name"], "config": agent, "tools": [t["name"] for t in tools], "tool_specs": tools,
               "turns": 0, "history": list(body.get("messages") or []) if VERSION >= 3 else []}
    SESSIONS[session["id"]] = session
    STATS["created"] += 1
    STATS["open"] += 1
    return session


async def _turn(session: dict, body: dict, first: bool, status: int = 200) -> Response:
    messages = body.get("messages") or []
    if session["turns"] == 0:
        STATS["first_messages"].append(messages)
    STATS["turns"] += 1
    try:
        events = script(session, messages)
    except AgentCrash as exc:
        return JSONResponse({"error": str(exc)}, status_code=500)
    mode = body.get("stream") or "none"
    if mode in ("delta", "message"):
        return StreamingResponse(_sse(session, events, mode, first), media_type="text/event-stream")
    reply = _none_reply(events)
    if first:
        reply["sessionId"] = session["id"]
    return JSONResponse(reply, status_code=status)


async def post_sessions(request: Request) -> Response:  # v3
    if (refused := _unauthorized(request)) is not None:
        return refused
    session = _new_session(await request.json())
    if isinstance(session, Response):
        return session
    return JSONResponse({"sessionId": session["id"]}, status_code=201)


async def post_turn(request: Request) -> Response:  # v3
    if (refused := _unauthorized(request)) is not None:
        return refused
    body = await request.json()
    session = SESSIONS.get(request.path_params["sid"])
    if session is None:
        return JSONResponse({"error": "Session not found"}, status_code=404)
    return await _turn(session, body, first=False)


async def put_session(request: Request) -> Response:  # v2
    if (refused := _unauthorized(request)) is not None:
        return refused
    body = await request.json()
    messages = body.get("messages") or []
    if not messages or messages[-1].get("role") != "user":
        return JSONResponse({"error": "Last message must be a user message"}, status_code=400)
    session = _new_session(body)
    if isinstance(session, Response):
        return session
    return await _turn(session, body, first=True, status=201)


async def post_session(request: Request) -> Response:  # v2
    if (refused := _unauthorized(request)) is not None:
        return refused
    session = SESSIONS.get(request.path_params["sid"])
    if session is None:
        return JSONResponse({"error": "Session not found"}, status_code=404)
    return await _turn(session, await request.json(), first=False)


def _info(session: dict) -> dict:
    options = {k: "***" if k == "model" else v for k, v in (session["config"].get("options") or {}).items()}
    return {"sessionId": session["id"], "agent": {**session["config"], "options": options},
            "tools": session["tool_specs"] or None}


async def get_session(request: Request) -> Response:
    if (refused := _unauthorized(request)) is not None:
        return refused
    session = SESSIONS.get(request.path_params["sid"])
    return JSONResponse(_info(session)) if session else JSONResponse({"error": "Session not found"}, status_code=404)


async def get_history(request: Request) -> Response:
    if (refused := _unauthorized(request)) is not None:
        return refused
    kind = request.query_params.get("type")
    if kind not in ("compacted", "full"):
        return JSONResponse({"error": 'type must be "compacted" or "full"'}, status_code=400)
    session = SESSIONS.get(request.path_params["sid"])
    if session is None or kind != "full":
        return JSONResponse({"error": "Specified history not found"}, status_code=404)
    return JSONResponse({"history": {kind: session["history"]}})


async def list_sessions(request: Request) -> Response:
    if (refused := _unauthorized(request)) is not None:
        return refused
    return JSONResponse({"sessions": [_info(s) for s in SESSIONS.values()]})


async def delete_session(request: Request) -> Response:
    if (refused := _unauthorized(request)) is not None:
        return refused
    if SESSIONS.pop(request.path_params["sid"], None) is None:
        if VERSION >= 3:
            return JSONResponse({"error": "Session not found"}, status_code=404)
        return Response(status_code=204)
    STATS["open"] -= 1
    STATS["deleted"] += 1
    return Response(status_code=204)


async def get_meta(request: Request) -> Response:
    return JSONResponse(meta())


async def get_stats(request: Request) -> Response:
    return JSONResponse({**STATS, "auth": sorted(set(STATS["auth"]))})


async def reset_stats(request: Request) -> Response:
    _reset()
    return JSONResponse({"ok": True})


def routes(version: int) -> list[Route]:
    common = [Route("/meta", get_meta), Route("/sessions", list_sessions),
              Route("/_stats", get_stats), Route("/_reset", reset_stats, methods=["POST"])]
    if version >= 3:
        return common + [
            Route("/sessions", post_sessions, methods=["POST"]),
            Route("/sessions/{sid}/turns", post_turn, methods=["POST"]),
            Route("/sessions/{sid}/history", get_history),
            Route("/sessions/{sid}", get_session, methods=["GET"]),
            Route("/sessions/{sid}", delete_session, methods=["DELETE"])]
    return common + [
        Route("/session", put_session, methods=["PUT"]),
        Route("/session/{sid}/history", get_history),
        Route("/session/{sid}", post_session, methods=["POST"]),
        Route("/session/{sid}", get_session, methods=["GET"]),
        Route("/session/{sid}", delete_session, methods=["DELETE"])]


def main() -> None:
    global API_KEY, VERSION
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--version", type=int, choices=(2, 3), required=True)
    parser.add_argument("--api-key", default="")
    args = parser.parse_args()
    API_KEY, VERSION = args.api_key, args.version
    ANSWERS.answer("")  # build the answer table before serving
    app = Starlette(routes=routes(VERSION))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
