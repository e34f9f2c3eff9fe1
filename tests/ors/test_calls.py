"""POST /{env}/call: SSE framing, tool-level errors, exceptions in tool code, chunking, pings,
reconnects, the audit log, and how calls of one or several sessions are scheduled."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import uuid

import httpx
import pytest

from tests.fixtures.ors import parse_sse, sse_result, start_episode
from tests.ors.support import PROBE, acalls, in_db, publish_probe_sync, sid_headers, wait_for

CHUNK = 4096
TASK_ID = re.compile(r"^[0-9a-f]{32}$")


async def math_session(client, person, index: int = 0) -> tuple[str, dict]:
    task = (await client.post("/math/task", headers=person.headers, json={"split": "test", "index": index})).json()["task"]
    sid = await start_episode(client, person.headers, split="test", index=index)
    return sid, task


async def call(client, person, sid: str, name: str, tool_input: dict | None = None, env: str = "math", **extra):
    body = {"name": name, "input": {} if tool_input is None else tool_input, **extra}
    return await client.post(f"/{env}/call", headers=sid_headers(person, sid), json=body)


def assert_sse_headers(r) -> None:
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"


async def test_a_call_streams_its_task_id_first_and_its_json_result_in_end(client, owner):
    sid, task = await math_session(client, owner)
    r = await call(client, owner, sid, "submit", {"answer": task["answer"]})
    assert_sse_headers(r)
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "end"]
    assert TASK_ID.match(events[0][1])
    result = json.loads(events[1][1])
    assert result == {"ok": True, "output": {
        "blocks": [{"text": "Correct.", "detail": None, "type": "text"}],
        "metadata": {"correct": True, "secrets_seen": []}, "reward": 1.0, "finished": True}}


async def test_a_wrong_answer_gets_no_reward_and_finishes_the_episode(client, owner):
    sid, task = await math_session(client, owner, 4)
    wrong = str(int(task["answer"]) + 1)
    result = sse_result((await call(client, owner, sid, "submit", {"answer": wrong})).text)
    assert result["ok"] is True
    assert result["output"]["reward"] == 0.0 and result["output"]["finished"] is True
    assert result["output"]["metadata"]["correct"] is False


async def test_each_call_gets_its_own_task_id(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    ids = set()
    for n in range(3):
        r = await call(client, owner, sid, "count", {"n": n}, env=probe)
        events = parse_sse(r.text)
        ids.add(events[0][1])
        assert json.loads(events[-1][1])["output"]["blocks"][0]["text"] == str(2 * n)
    assert len(ids) == 3


async def test_an_unknown_tool_ends_with_ok_false_and_reason_not_found(client, owner):
    sid, _ = await math_session(client, owner)
    r = await call(client, owner, sid, "no_such_tool", {})
    assert_sse_headers(r)
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "end"]
    result = json.loads(events[-1][1])
    assert result["ok"] is False and result["reason"] == "not_found"
    assert isinstance(result["error"], str) and result["error"]
    # A tool-level error does not end the episode.
    result = sse_result((await call(client, owner, sid, "submit", {"answer": "1"})).text)
    assert result["ok"] is True


async def test_a_private_method_is_not_callable_as_a_tool(client, owner):
    sid, _ = await math_session(client, owner)
    for name in ("_secrets", "__init__", "get_prompt", "setup", "teardown", "list_tasks"):
        result = sse_result((await call(client, owner, sid, name, {})).text)
        assert result["ok"] is False, name
        assert result["reason"] == "not_found", (name, result)


async def test_invalid_tool_input_ends_with_ok_false_and_reason_input_validation(client, owner, probe):
    sid, _ = await math_session(client, owner)
    for bad in ({}, {"answer": ["1"]}, {"answer": {"x": 1}}):
        r = await call(client, owner, sid, "submit", bad)
        events = parse_sse(r.text)
        assert [e for e, _ in events] == ["task_id", "end"]
        result = json.loads(events[-1][1])
        assert result["ok"] is False and result["reason"] == "input_validation", result
        assert result["error"]
    psid = await start_episode(client, owner.headers, env=probe, task_spec={})
    result = sse_result((await call(client, owner, psid, "count", {"n": "many"}, env=probe)).text)
    assert result["ok"] is False and result["reason"] == "input_validation"


async def test_a_call_after_the_episode_finished_ends_with_reason_episode_finished(client, owner):
    sid, task = await math_session(client, owner)
    assert sse_result((await call(client, owner, sid, "submit", {"answer": task["answer"]})).text)["ok"] is True
    r = await call(client, owner, sid, "submit", {"answer": task["answer"]})
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "end"]
    result = json.loads(events[-1][1])
    assert result["ok"] is False and result["reason"] == "episode_finished" and result["error"]
    rows = await acalls(sid)
    assert [row["status"] for row in rows] == ["ok", "error"]


async def test_tool_code_that_raises_sends_an_error_event_and_no_end(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    r = await call(client, owner, sid, "boom", env=probe)
    assert_sse_headers(r)
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "error"]
    assert "kaboom from tool code" in events[1][1]
    (row,) = await acalls(sid)
    assert row["task_id"] == events[0][1]
    assert row["name"] == "boom" and row["status"] == "error"
    assert "kaboom from tool code" in row["error"]
    assert row["output"] is None
    # The session survives its tool's exception.
    result = sse_result((await call(client, owner, sid, "count", {"n": 1}, env=probe)).text)
    assert result["ok"] is True


async def test_a_large_result_is_split_into_4096_character_chunks(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    r = await call(client, owner, sid, "big", {"size": 20_000}, env=probe)
    assert_sse_headers(r)
    events = parse_sse(r.text)
    kinds = [e for e, _ in events]
    assert kinds[0] == "task_id" and kinds[-1] == "end"
    assert set(kinds[1:-1]) == {"chunk"} and len(kinds) - 2 >= 4
    for _, data in events[1:-1]:
        assert len(data) == CHUNK
    assert 0 < len(events[-1][1]) <= CHUNK
    payload = "".join(d for _, d in events[1:])
    result = json.loads(payload)
    text = "".join(chr(ord("a") + i % 26) for i in range(20_000))
    assert result == {"ok": True, "output": {"blocks": [{"text": text, "detail": None, "type": "text"}],
                                             "metadata": {"size": 20_000}, "reward": 0.25, "finished": False}}
    assert len(payload) == (len(kinds) - 2) * CHUNK + len(events[-1][1])


async def test_a_result_of_exactly_one_chunk_is_sent_as_end_alone(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    overhead = len(json.dumps(sse_result((await call(client, owner, sid, "big", {"size": 0}, env=probe)).text),
                              separators=(",", ":")).replace('"size":0', '"size":1000'))
    size = CHUNK - overhead
    r = await call(client, owner, sid, "big", {"size": size}, env=probe)
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "end"], [(e, len(d)) for e, d in events]
    assert len(events[1][1]) == CHUNK
    r = await call(client, owner, sid, "big", {"size": size + 1}, env=probe)
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "chunk", "end"]
    assert len(events[1][1]) == CHUNK and len(events[2][1]) == 1
    assert json.loads(events[1][1] + events[2][1])["output"]["metadata"]["size"] == size + 1


async def test_pings_are_sent_while_a_tool_runs(client, owner, probe, settings):
    settings.ORS_SSE_PING_SECONDS = 0.1
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    r = await call(client, owner, sid, "nap", {"seconds": 0.5}, env=probe)
    assert_sse_headers(r)
    events = parse_sse(r.text)
    assert events[0][0] == "task_id" and events[-1][0] == "end"
    pings = [i for i, (e, d) in enumerate(events) if e == ":"]
    assert len(pings) >= 1
    assert all(events[i][1] == "ping" for i in pings)
    assert all(0 < i < len(events) - 1 for i in pings)
    assert ": ping\n\n" in r.text
    assert json.loads(events[-1][1])["ok"] is True


async def test_reconnecting_with_the_task_id_returns_the_same_result_without_a_new_call(client, owner):
    sid, task = await math_session(client, owner)
    first = await call(client, owner, sid, "submit", {"answer": task["answer"]})
    task_id = parse_sse(first.text)[0][1]
    again = await client.post("/math/call", headers=sid_headers(owner, sid), json={"task_id": task_id})
    assert_sse_headers(again)
    assert parse_sse(again.text)[0] == ("task_id", task_id)
    assert sse_result(again.text) == sse_result(first.text)
    # The reconnect may carry the original name/input too; it is still not a new call.
    again = await call(client, owner, sid, "submit", {"answer": task["answer"]}, task_id=task_id)
    assert sse_result(again.text) == sse_result(first.text)
    rows = await acalls(sid)
    assert len(rows) == 1 and rows[0]["task_id"] == task_id


async def test_reconnecting_to_a_running_call_waits_for_its_result(client, owner, probe, ors_app):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    first = asyncio.ensure_future(call(client, owner, sid, "nap", {"seconds": 0.4}, env=probe))
    live = ors_app.gateway.sessions[sid]
    task_id = await wait_for(lambda: next(iter(live.calls), None), what="the call to start")
    again = await client.post(f"/{probe}/call", headers=sid_headers(owner, sid), json={"task_id": task_id})
    first = await first
    assert parse_sse(first.text)[0] == ("task_id", task_id)
    assert sse_result(again.text) == sse_result(first.text)
    assert sse_result(again.text)["ok"] is True
    assert len(await acalls(sid)) == 1


async def test_a_reconnect_after_the_result_left_memory_is_served_from_the_audit_log(client, owner, ors_app, settings):
    sid, task = await math_session(client, owner)
    first = await call(client, owner, sid, "submit", {"answer": task["answer"]})
    task_id = parse_sse(first.text)[0][1]
    settings.ORS_RESULT_LINGER_SECONDS = 0
    await ors_app.gateway.reap_once()
    assert ors_app.gateway.sessions[sid].calls == {}
    again = await client.post("/math/call", headers=sid_headers(owner, sid), json={"task_id": task_id})
    assert parse_sse(again.text)[0] == ("task_id", task_id)
    assert sse_result(again.text) == sse_result(first.text)
    assert len(await acalls(sid)) == 1


async def test_results_linger_for_at_least_60_seconds_by_default(client, owner, ors_app, settings):
    assert settings.ORS_RESULT_LINGER_SECONDS >= 60
    sid, task = await math_session(client, owner)
    task_id = parse_sse((await call(client, owner, sid, "submit", {"answer": "1"})).text)[0][1]
    ors_app.gateway.sessions[sid].calls[task_id].finished_at -= 59
    await ors_app.gateway.reap_once()
    assert task_id in ors_app.gateway.sessions[sid].calls


async def test_an_unknown_task_id_answers_an_error_event(client, owner):
    sid, _ = await math_session(client, owner)
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"task_id": uuid.uuid4().hex})
    assert_sse_headers(r)
    assert parse_sse(r.text) == [("error", "unknown task_id")]
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"task_id": "x" * 300})
    assert parse_sse(r.text) == [("error", "unknown task_id")]
    assert await acalls(sid) == []


async def test_a_task_id_of_another_session_is_unknown(client, owner):
    sid_a, task = await math_session(client, owner)
    sid_b, _ = await math_session(client, owner, 1)
    task_id = parse_sse((await call(client, owner, sid_a, "submit", {"answer": task["answer"]})).text)[0][1]
    r = await client.post("/math/call", headers=sid_headers(owner, sid_b), json={"task_id": task_id})
    assert parse_sse(r.text) == [("error", "unknown task_id")]


async def test_the_audit_row_records_the_call(client, owner):
    sid, task = await math_session(client, owner)
    before = time.time()
    r = await call(client, owner, sid, "submit", {"answer": task["answer"]})
    task_id = parse_sse(r.text)[0][1]
    (row,) = await acalls(sid)
    assert row["task_id"] == task_id
    assert row["name"] == "submit"
    assert row["input"] == {"answer": task["answer"]}
    assert row["output"] == sse_result(r.text)
    assert row["reward"] == 1.0 and row["finished"] is True
    assert row["status"] == "ok" and row["error"] == ""
    assert row["started_at"] is not None and row["finished_at"] is not None
    assert row["started_at"] <= row["finished_at"]
    assert abs(row["started_at"].timestamp() - before) < 30


async def test_the_audit_row_of_a_tool_level_error_records_the_reason(client, owner):
    sid, _ = await math_session(client, owner)
    r = await call(client, owner, sid, "nope", {"x": 1})
    (row,) = await acalls(sid)
    assert row["name"] == "nope" and row["input"] == {"x": 1}
    assert row["status"] == "error" and row["error"]
    assert row["output"] == sse_result(r.text)
    assert row["reward"] is None and row["finished"] is False


async def test_the_session_row_gets_the_totals_when_it_ends(client, owner):
    sid, task = await math_session(client, owner)
    await call(client, owner, sid, "nope", {})
    await call(client, owner, sid, "submit", {"answer": task["answer"]})
    await client.post("/delete", headers=sid_headers(owner, sid))
    from tests.ors.support import arow

    row = await arow(sid)
    assert row["calls"] == 2 and row["total_reward"] == 1.0 and row["finished"] is True


async def test_calls_within_one_session_run_one_at_a_time(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    started = time.monotonic()
    results = await asyncio.gather(*(call(client, owner, sid, "nap", {"seconds": 0.15}, env=probe) for _ in range(3)))
    elapsed = time.monotonic() - started
    for r in results:
        result = sse_result(r.text)
        assert result["ok"] is True
        assert result["output"]["metadata"]["max_inflight"] == 1
    assert elapsed >= 0.45
    assert len(await acalls(sid)) == 3


async def test_calls_of_different_sessions_run_concurrently(client, owner, probe):
    sids = [await start_episode(client, owner.headers, env=probe, task_spec={}) for _ in range(2)]
    # Setup is done before timing starts.
    for sid in sids:
        assert (await client.get(f"/{probe}/prompt", headers=sid_headers(owner, sid))).status_code == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(call(client, owner, sid, "nap", {"seconds": 0.5}, env=probe) for sid in sids))
    elapsed = loop.time() - started
    assert all(sse_result(r.text)["ok"] for r in results)
    assert elapsed < 0.9, f"two 0.5 s calls of two sessions took {elapsed:.2f} s"


async def test_a_blocking_sync_tool_does_not_block_other_sessions(client, ors_app, owner, probe):
    busy = await start_episode(client, owner.headers, env=probe, task_spec={})
    other = await start_episode(client, owner.headers, env=probe, task_spec={})
    marker = uuid.uuid4().hex
    blocked = asyncio.ensure_future(call(client, owner, busy, "block", {"seconds": 1.0, "marker": marker},
                                         env=probe))
    await wait_for(lambda: any(f"started {marker}" in line for w in ors_app.gateway.executor.pool.workers()
                               for line in w.recent_stderr()), what="the blocking tool to start")
    r = await client.post("/ping", headers=sid_headers(owner, other))
    assert r.status_code == 200
    assert not blocked.done(), "the ping must complete while the sync tool still blocks"
    r = await client.post("/ping", headers=sid_headers(owner, busy))
    assert r.status_code == 200
    r = await call(client, owner, other, "count", {"n": 21}, env=probe)
    assert sse_result(r.text)["output"]["blocks"][0]["text"] == "42"
    assert not blocked.done(), "another session's call must complete while the sync tool still blocks"
    result = sse_result((await blocked).text)
    assert result["ok"] is True and result["output"]["blocks"][0]["text"] == "unblocked"


async def test_the_default_ping_interval_keeps_clients_alive(settings):
    # The openreward client gives up after 30 s of silence; the documents promise a ping every 10 s.
    assert 0 < settings.ORS_SSE_PING_SECONDS <= 10


async def test_a_tool_that_runs_past_the_timeout_ends_with_reason_timeout(client, owner, tmp_path):
    env = await in_db(publish_probe_sync, owner.team, tmp_path, slug="probe-fast", tool_timeout=0.3)
    sid = await start_episode(client, owner.headers, env=env, task_spec={})
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Far shorter than the nap, whatever a loaded machine adds to the worker's start.
    r = await call(client, owner, sid, "nap", {"seconds": 60}, env=env)
    assert loop.time() - started < 20
    events = parse_sse(r.text)
    assert [e for e, _ in events if e != ":"] == ["task_id", "end"]
    result = json.loads(events[-1][1])
    assert result["ok"] is False and result["reason"] == "timeout" and result["error"]
    (row,) = await acalls(sid)
    assert row["status"] == "error" and row["name"] == "nap"
    # The session stays usable.
    result = sse_result((await call(client, owner, sid, "count", {"n": 3}, env=env)).text)
    assert result["ok"] is True and result["output"]["blocks"][0]["text"] == "6"


async def test_a_client_that_disconnects_mid_call_does_not_cancel_it(client, owner, probe, ors_app):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    body = json.dumps({"name": "nap", "input": {"seconds": 0.3}}).encode()
    hung_up = asyncio.Event()
    request_sent = False
    sent: list[dict] = []

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and b"event: task_id" in message.get("body", b""):
            hung_up.set()  # the client goes away right after it learnt the task_id

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": f"/{probe}/call", "raw_path": f"/{probe}/call".encode(), "query_string": b"", "root_path": "",
             "headers": [(b"x-api-key", owner.token.encode()), (b"x-session-id", sid.encode()),
                         (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    await ors_app(scope, receive, send)
    streamed = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    events = parse_sse(streamed)
    assert events[0][0] == "task_id" and "end" not in [e for e, _ in events]
    task_id = events[0][1]

    rows = await wait_for(lambda: acalls(sid), what="the abandoned call to be recorded")
    assert [row["task_id"] for row in rows] == [task_id] and rows[0]["status"] == "ok"
    r = await client.post(f"/{probe}/call", headers=sid_headers(owner, sid), json={"task_id": task_id})
    result = sse_result(r.text)
    assert result["ok"] is True and result["output"]["blocks"][0]["text"] == "rested"
    assert len(await acalls(sid)) == 1


async def test_a_session_with_a_running_call_is_not_reaped(client, owner, probe, ors_app, settings):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    running = asyncio.ensure_future(call(client, owner, sid, "nap", {"seconds": 0.8}, env=probe))
    live = ors_app.gateway.sessions[sid]
    await wait_for(lambda: live.calls, what="the call to start")
    settings.ORS_IDLE_TIMEOUT_SECONDS = 0
    await ors_app.gateway.reap_once()
    assert sid in ors_app.gateway.sessions
    assert sse_result((await running).text)["ok"] is True
    await ors_app.gateway.reap_once()
    assert sid not in ors_app.gateway.sessions
    r = await client.post("/ping", headers=sid_headers(owner, sid))
    assert r.status_code == 404 and "expired" in r.json()["detail"]


async def test_a_result_that_cannot_be_encoded_still_ends_the_stream(client, owner, probe, settings):
    settings.ORS_SSE_PING_SECONDS = 0.2
    sid = await start_episode(client, owner.headers, env=probe, task_spec={})
    try:
        r = await asyncio.wait_for(call(client, owner, sid, "mangled", env=probe), timeout=20)
    except TimeoutError:
        pytest.fail("the call's stream never ended: only pings for 20 s after the tool returned")
    events = [(e, d) for e, d in parse_sse(r.text) if e != ":"]
    assert events[0][0] == "task_id"
    assert events[-1][0] in ("error", "end")
    if events[-1][0] == "end":
        json.loads("".join(d for e, d in events if e in ("chunk", "end")))
    # The session is not stuck.
    result = sse_result((await call(client, owner, sid, "count", {"n": 2}, env=probe)).text)
    assert result["ok"] is True


@pytest.mark.e2e
async def test_environment_code_that_raises_system_exit_does_not_take_the_gateway_down(
        server_factory, owner, tmp_path):
    # A real server process: in-process, a SystemExit escaping the event loop would end the test run.
    await in_db(publish_probe_sync, owner.team, tmp_path)
    problems: list[str] = []
    server = server_factory()
    for case in ("sync tool calls sys.exit()", "async tool raises SystemExit", "get_prompt calls sys.exit()"):
        if server.process.poll() is not None:
            server = server_factory()  # the previous case took it down; go on with the next one
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
            sid = (await c.post("/create_session", headers=owner.headers)).json()["sid"]
            h = sid_headers(owner, sid)
            spec = {"prompt_exit": True} if "get_prompt" in case else {}
            assert (await c.post(f"/{PROBE}/create", headers=h, json={"task_spec": spec})).status_code == 200
            try:
                if "get_prompt" in case:
                    r = await c.get(f"/{PROBE}/prompt", headers=h)
                    if r.status_code != 500 or "detail" not in r.json():
                        problems.append(f"{case}: prompt answered {r.status_code} {r.text[:200]}")
                else:
                    name = "leave" if case.startswith("sync") else "leave_async"
                    r = await c.post(f"/{PROBE}/call", headers=h, json={"name": name, "input": {}})
                    kinds = [e for e, _ in parse_sse(r.text) if e != ":"]
                    if kinds != ["task_id", "error"]:
                        problems.append(f"{case}: stream {r.text[:200]}")
                assert (await c.get("/health")).status_code == 200
                assert (await c.post("/ping", headers=h)).status_code == 200
            except httpx.TransportError as exc:
                try:
                    code = server.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    code = None
                problems.append(f"{case}: the gateway went away ({exc!r}); its process exit code: {code}")
    assert not problems, "\n".join(problems)
