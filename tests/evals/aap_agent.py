"""A reference AAP v1 agent server (tests/evals/aap_sdk_agent.py speaks versions 2 and 3) for the evaluation tests and the benchmark: a scripted agent in
its own process, over real HTTP and SSE, in all three stream modes.

    python tests/evals/aap_agent.py --port 8765 [--api-key KEY]

Agents (GET /meta): `solver` answers the bundled `math` tasks, correctly unless `fails(question)`
(about a third of them, on purpose); `asker` first asks for its untrusted server-side tool
`web_search` together with a `submit` the environment refuses (no answer in it), then answers
correctly; `juggler` first calls two tools the environment does not have and a refused `submit`,
then answers correctly; `silent` ends its turn without calling a tool; `looper` calls a tool that
does not exist forever; and the faults: `http500`, `http429` (refuses PUT /session, creating
nothing), `http400` (a first turn like looper's, then refuses the POST with the results),
`malformed` (data that is not JSON), `confused` (a well-formed reply, its session id included,
with a stopReason version 1 does not have), `truncated` (the stream ends without turn_stop), `endless` (a
stream that never ends), `slow` (never answers), `sluggish` (the solver, taking a second over the
first turn: after session_start in the stream modes, before the reply in "none"). `/v4/meta` claims
protocol version 4 (a draft no SDK speaks). GET /_stats tells what the server saw (the PUT bodies, sessions open at once, sessions whose id
it gave out, deletes, permission decisions, the messages of each POST, Authorization headers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
MATH_DIR = ROOT / "envs" / "math"

AGENTS = ["solver", "asker", "juggler", "silent", "looper", "http500", "http429", "http400", "malformed", "confused",
          "truncated", "endless", "slow", "sluggish", "stepper"]
SLUGGISH_SECONDS = 1.0
ALL_STREAMS = {"delta": {}, "message": {}, "none": {}}


def _math_module():
    sys.path.insert(0, str(MATH_DIR))
    try:
        import env as math_env  # envs/math/env.py: plain ors-sdk code, no Django
    finally:
        sys.path.remove(str(MATH_DIR))
    return math_env


def question_of(prompt: str) -> str:
    return prompt.split("\n\n")[0].strip()


def fails(question: str) -> bool:
    """Whether `solver` answers this question wrong (deterministic, about one in three)."""
    return zlib.crc32(question.encode()) % 3 == 0


def expected_reward(split: str, index: int) -> float:
    """What `solver` scores on task `index` of the math split: the tests' known outcomes."""
    task = _math_module()._make_task(split, index)
    return 0.0 if fails(task["question"]) else 1.0


class Answers:
    def __init__(self) -> None:
        self._by_question: dict[str, str] | None = None

    def answer(self, question: str) -> str:
        if self._by_question is None:
            module = _math_module()
            self._by_question = {}
            for split in ("test", "train"):
                for task in module.Math.list_tasks(split):
                    self._by_question[task["question"]] = task["answer"]
        return self._by_question.get(question, "0")


ANSWERS = Answers()
STATS: dict = {"open": 0, "max_open": 0, "created": 0, "told": 0, "deleted": 0, "permissions": [], "auth": [],
               "puts": 0, "posts": 0, "post_messages": [], "put_bodies": []}
SESSIONS: dict[str, dict] = {}
API_KEY = ""


def meta(version: int = 1) -> dict:
    agents = []
    for name in AGENTS:
        entry = {"name": name, "title": name.title(), "version": "1.0.0",
                 "description": f"Scripted test agent ({name}).", "tools": [], "options": [
                     {"name": "style", "type": "select", "options": ["terse", "chatty"], "default": "terse"}],
                 "capabilities": {"stream": ALL_STREAMS, "application": {"tools": {}}}}
        if name == "asker":
            entry["tools"] = [{"name": "web_search", "description": "Search the web",
                               "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}}}]
        agents.append(entry)
    # An agent whose /meta declares no stream capability: it only supports "none"; and one that takes
    # no application-side tools (so no environment's tools).
    agents.append({"name": "plain", "version": "1.0.0", "tools": [], "options": [],
                   "capabilities": {"application": {"tools": {}}}})
    agents.append({"name": "toolless", "version": "1.0.0", "tools": [], "options": []})
    return {"version": version, "agents": agents}


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _usage(session: dict) -> dict:
    return {"usage": {"inputTokens": len(session["question"]) // 4 + 10 * session["turns"], "outputTokens": 7}}


def script(session: dict, messages: list[dict]) -> list[tuple[str, dict]]:
    """The events of this turn (turn_stop last), for a scripted agent."""
    name, question = session["agent"], session["question"]
    session["turns"] += 1
    call = f"call_{uuid.uuid4().hex[:8]}"
    if name in ("solver", "sluggish"):
        if session["turns"] == 1:
            answer = ANSWERS.answer(question)
            if fails(question):
                answer = str(int(answer) + 1)
            return [("thinking", {"thinking": f"The question asks: {question[:40]}"}),
                    ("text", {"text": f"My answer is {answer}."}),
                    ("tool_call", {"toolCallId": call, "name": "submit", "input": {"answer": answer}}),
                    ("turn_stop", {"stopReason": "tool_use"})]
        return [("text", {"text": "Done."}), ("turn_stop", {"stopReason": "end_turn"})]
    if name == "stepper":  # an OpenEnv step environment's one tool (tests/containers: the ledger)
        if session["turns"] == 1:
            return [("tool_call", {"toolCallId": call, "name": "step", "input": {"amount": 10, "note": "eval"}}),
                    ("turn_stop", {"stopReason": "tool_use"})]
        return [("text", {"text": "Done."}), ("turn_stop", {"stopReason": "end_turn"})]
    if name == "asker":
        if session["turns"] == 1:
            # The untrusted server-side tool and an application tool call that does not end the
            # episode (the environment refuses a submit without an answer): the permission decision
            # and the tool result come back in one POST.
            return [("text", {"text": "Let me search first."}),
                    ("tool_call", {"toolCallId": call, "name": "web_search", "input": {"query": question}}),
                    ("tool_call", {"toolCallId": f"{call}_b", "name": "submit", "input": {"guess": "later"}}),
                    ("turn_stop", {"stopReason": "tool_use"})]
        denied = [m for m in messages if m.get("role") == "tool_permission"]
        STATS["permissions"].extend(denied)
        return [("text", {"text": f"Search {'denied' if denied and not denied[0]['granted'] else 'done'}; answering."}),
                ("tool_call", {"toolCallId": call, "name": "submit", "input": {"answer": ANSWERS.answer(question)}}),
                ("turn_stop", {"stopReason": "tool_use"})]
    if name == "juggler":
        if session["turns"] == 1:
            # Three calls that do not end the episode: two tools the environment does not have and a
            # submit it refuses; all three results come back in one POST.
            return [("text", {"text": "Let me work it out first."}),
                    ("tool_call", {"toolCallId": f"{call}_a", "name": "scratchpad", "input": {"note": question}}),
                    ("tool_call", {"toolCallId": f"{call}_b", "name": "calculator", "input": {"expr": "1+1"}}),
                    ("tool_call", {"toolCallId": f"{call}_c", "name": "submit", "input": {"guess": "later"}}),
                    ("turn_stop", {"stopReason": "tool_use"})]
        if session["turns"] == 2:
            return [("text", {"text": "Now I know."}),
                    ("tool_call", {"toolCallId": call, "name": "submit", "input": {"answer": ANSWERS.answer(question)}}),
                    ("turn_stop", {"stopReason": "tool_use"})]
        return [("text", {"text": "Done."}), ("turn_stop", {"stopReason": "end_turn"})]
    if name == "confused":
        return [("text", {"text": "Hmm."}), ("turn_stop", {"stopReason": "pondering"})]
    if name in ("looper", "http400"):
        return [("text", {"text": f"Turn {session['turns']}: thinking more."}),
                ("tool_call", {"toolCallId": call, "name": "scratchpad", "input": {"note": "hmm"}}),
                ("turn_stop", {"stopReason": "tool_use"})]
    return [("text", {"text": "I would rather not use any tool."}), ("turn_stop", {"stopReason": "end_turn"})]


def _frame(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _sse(session: dict, events: list[tuple[str, dict]], mode: str, first: bool) -> AsyncIterator[bytes]:
    name = session["agent"]
    if first:
        STATS["told"] += 1
        yield _frame("session_start", {"sessionId": session["id"]})
        if name == "sluggish":
            await asyncio.sleep(SLUGGISH_SECONDS)
    yield _frame("turn_start", {})
    if name == "malformed":
        yield b"event: text\ndata: {this is not json\n\n"
        return
    if name == "endless":
        while True:
            yield _frame("text_delta", {"delta": "and on "})
            await asyncio.sleep(0.02)
    for event, data in events:
        if event == "turn_stop":
            data = {**data, "_meta": _usage(session)}
            if name == "truncated":
                return  # the connection closes without turn_stop
        if mode == "delta" and event in ("text", "thinking"):
            text = data[event]
            for i in range(0, len(text), 8):
                yield _frame(f"{event}_delta", {"delta": text[i:i + 8]})
            continue
        yield _frame(event, data)


def _json_reply(session: dict, events: list[tuple[str, dict]], first: bool) -> Response:
    name = session["agent"]
    if name == "malformed":
        return PlainTextResponse("this is not json", media_type="application/json")
    if name == "endless":
        async def forever() -> AsyncIterator[bytes]:
            yield b'{"stopReason": "end_turn", "messages": ['
            while True:
                await asyncio.sleep(0.05)
                yield b" "
        return StreamingResponse(forever(), media_type="application/json")
    blocks, stop = [], "end_turn"
    for event, data in events:
        if event in ("text", "thinking"):
            blocks.append({"type": event, event: data[event]})
        elif event == "tool_call":
            blocks.append({"type": "tool_use", **data})
        elif event == "turn_stop":
            stop = data["stopReason"]
    if name == "truncated":
        return PlainTextResponse('{"stopReason": "end_tu', media_type="application/json")
    body = {"stopReason": stop, "messages": [{"role": "assistant", "content": blocks}], "_meta": _usage(session)}
    if first:
        STATS["told"] += 1
        body["sessionId"] = session["id"]
    return JSONResponse(body)


def _authorized(request: Request) -> bool:
    STATS["auth"].append(request.headers.get("authorization", ""))
    return not API_KEY or request.headers.get("authorization") == f"Bearer {API_KEY}"


async def _turn(session: dict, body: dict, first: bool) -> Response:
    name = session["agent"]
    if name == "http500":
        return PlainTextResponse("the agent exploded", status_code=500)
    if name == "http400" and not first:
        return PlainTextResponse("the agent refused the tool results", status_code=400)
    if name == "slow":
        await asyncio.sleep(3600)
    events = script(session, body.get("messages") or [])
    mode = body.get("stream") or "none"
    if mode == "none":
        if name == "sluggish" and first:
            await asyncio.sleep(SLUGGISH_SECONDS)
        return _json_reply(session, events, first)
    return StreamingResponse(_sse(session, events, mode, first), media_type="text/event-stream")


async def put_session(request: Request) -> Response:
    if not _authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    body = await request.json()
    STATS["puts"] += 1
    STATS["put_bodies"].append(body)  # what the platform sends an agent (no hidden task field, ever)
    name = (body.get("agent") or {}).get("name")
    if name not in AGENTS:
        return JSONResponse({"error": f"no agent {name!r}"}, status_code=404)
    if name == "http429":
        return PlainTextResponse("too many sessions", status_code=429, headers={"Retry-After": "1"})
    messages = body.get("messages") or []
    prompt = _text_of(messages[-1]["content"]) if messages else ""
    session = {"id": f"sess_{uuid.uuid4().hex[:12]}", "agent": name, "question": question_of(prompt), "turns": 0,
               "tools": [t["name"] for t in body.get("tools") or []]}
    SESSIONS[session["id"]] = session
    STATS["created"] += 1
    STATS["open"] += 1
    STATS["max_open"] = max(STATS["max_open"], STATS["open"])
    return await _turn(session, body, first=True)


async def post_session(request: Request) -> Response:
    if not _authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    session = SESSIONS.get(request.path_params["sid"])
    if session is None:
        return JSONResponse({"error": "no such session"}, status_code=404)
    STATS["posts"] += 1
    body = await request.json()
    STATS["post_messages"].append({"session": session["id"], "messages": body.get("messages")})
    return await _turn(session, body, first=False)


async def delete_session(request: Request) -> Response:
    if not _authorized(request):
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    if SESSIONS.pop(request.path_params["sid"], None) is not None:
        STATS["open"] -= 1
        STATS["deleted"] += 1
    return Response(status_code=204)


async def get_meta(request: Request) -> Response:
    return JSONResponse(meta(4 if request.url.path.startswith("/v4") else 1))


async def get_stats(request: Request) -> Response:
    return JSONResponse({**STATS, "auth": sorted(set(STATS["auth"]))})


async def reset_stats(request: Request) -> Response:
    # Sessions of earlier tests (a `slow` agent's, whose client gave up before learning its id) are
    # forgotten, so each test counts only its own.
    SESSIONS.clear()
    STATS.update(open=0, max_open=0, created=0, told=0, deleted=0, permissions=[], auth=[],
                 puts=0, posts=0, post_messages=[], put_bodies=[])
    return JSONResponse({"ok": True})


app = Starlette(routes=[
    Route("/meta", get_meta), Route("/v4/meta", get_meta),
    Route("/session", put_session, methods=["PUT"]),
    Route("/session/{sid}", post_session, methods=["POST"]),
    Route("/session/{sid}", delete_session, methods=["DELETE"]),
    Route("/_stats", get_stats), Route("/_reset", reset_stats, methods=["POST"]),
])


def main() -> None:
    global API_KEY
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default="")
    args = parser.parse_args()
    API_KEY = args.api_key
    ANSWERS.answer("")  # build the answer table before serving
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
