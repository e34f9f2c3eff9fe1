"""Session lifecycle: create_session, create, prompt, task_tools, ping, delete, delete_session,
expiry, waiting for setup, failed setup (secrets: test_session_secrets.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.fixtures.ors import parse_sse, sse_result, start_episode
from tests.ors.support import (
    acalls,
    acount,
    arow,
    assert_detail,
    in_db,
    sid_headers,
    wait_for,
)


async def math_task(client, person, split: str = "test", index: int = 0) -> dict:
    r = await client.post("/math/task", headers=person.headers, json={"split": split, "index": index})
    assert r.status_code == 200
    return r.json()["task"]


# --- create_session ---------------------------------------------------------------------------


async def test_create_session_answers_json_when_sse_is_not_accepted(client, owner):
    r = await client.post("/create_session", headers=owner.headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"sid"}
    assert str(uuid.UUID(body["sid"])) == body["sid"]
    r2 = await client.post("/create_session", headers={**owner.headers, "Accept": "application/json"})
    assert r2.json()["sid"] != body["sid"]


async def test_create_session_answers_sse_when_the_client_accepts_it(client, owner):
    r = await client.post("/create_session", headers={**owner.headers, "Accept": "text/event-stream"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-accel-buffering"] == "no"
    events = parse_sse(r.text)
    assert [e for e, _ in events] == ["task_id", "end"]
    sid = events[0][1]
    assert str(uuid.UUID(sid)) == sid
    assert events[1][1] == ""
    assert r.text == f"event: task_id\ndata: {sid}\n\nevent: end\ndata: \n\n"
    # The minted id works for /create.
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 0})
    assert r.status_code == 200 and r.json() == {"sid": sid}


async def test_create_session_answers_sse_for_an_accept_list_that_includes_it(client, owner):
    r = await client.post("/create_session",
                          headers={**owner.headers, "Accept": "application/json, text/event-stream;q=0.9"})
    assert r.headers["content-type"] == "text/event-stream"
    assert [e for e, _ in parse_sse(r.text)] == ["task_id", "end"]


@pytest.mark.parametrize("content", [b"", b"{}", b'{"env": {}}', b"  \n"])
async def test_create_session_accepts_an_empty_body_an_empty_object_or_no_env_vars(client, owner, content):
    r = await client.post("/create_session", headers={**owner.headers, "Content-Type": "application/json"},
                          content=content)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"sid"}


async def test_create_session_refuses_env_vars_it_could_not_give_the_session(client, owner, outsider):
    # Sessions share a worker process: variables of one session's own would be silently dropped.
    for person in (owner, outsider):
        r = await client.post("/create_session", headers={**person.headers, "Accept": "text/event-stream"},
                              json={"env": {"FOO": "bar"}})
        assert r.status_code == 400, r.text
        assert "'env'" in r.json()["detail"] and "secrets" in r.json()["detail"]


# --- create -----------------------------------------------------------------------------------


async def test_create_with_a_task_spec_starts_an_episode_on_that_task(client, owner):
    spec = {"question": "What is 40 + 2?", "answer": "42"}
    sid = await start_episode(client, owner.headers, task_spec=spec)
    r = await client.get("/math/prompt", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert spec["question"] in r.json()[0]["text"]
    row = await arow(sid)
    assert row["task_spec"] == spec and row["split"] == "" and row["task_index"] is None
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "42"}})
    assert sse_result(r.text)["output"]["reward"] == 1.0


async def test_create_with_split_and_index_resolves_the_task(client, owner):
    task = await math_task(client, owner, "test", 5)
    r = await client.post("/create_session", headers=owner.headers)
    sid = r.json()["sid"]
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 5})
    assert r.status_code == 200
    assert r.json() == {"sid": sid}
    r = await client.get("/math/prompt", headers=sid_headers(owner, sid))
    assert task["question"] in r.json()[0]["text"]
    row = await arow(sid)
    assert row["task_spec"] == task and row["split"] == "test" and row["task_index"] == 5
    assert row["status"] in ("creating", "ready")


@pytest.mark.parametrize("body", [
    {},
    {"env_name": "math"},
    {"task_spec": {"question": "q", "answer": "1"}, "split": "test", "index": 0},
    {"task_spec": {"question": "q", "answer": "1"}, "split": "test"},
    {"secrets": {"a": "b"}},
], ids=["empty", "env-only", "both", "spec-and-split", "secrets-only"])
async def test_create_with_both_or_neither_task_spec_and_split_index_answers_400(client, owner, body):
    sid = str(uuid.uuid4())
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json=body)
    assert_detail(r, 400)
    assert await arow(sid) is None


@pytest.mark.parametrize("body", [{"split": "test"}, {"index": 0}, {"split": "test", "index": None},
                                  {"split": None, "index": 3}])
async def test_create_with_split_or_index_alone_answers_400(client, owner, body):
    sid = str(uuid.uuid4())
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json=body)
    assert_detail(r, 400)
    assert await arow(sid) is None


async def test_a_second_create_with_the_same_sid_answers_400_session_already_exists(client, owner):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 1})
    assert "Session already exists" in assert_detail(r, 400)
    # The first episode is untouched.
    r = await client.post("/ping", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert (await arow(sid))["task_index"] == 0


async def test_a_deleted_sid_cannot_be_created_again(client, owner):
    sid = await start_episode(client, owner.headers)
    assert (await client.post("/delete", headers=sid_headers(owner, sid))).status_code == 200
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 1})
    assert "Session already exists" in assert_detail(r, 400)


async def test_create_without_a_session_id_answers_400(client, owner, ors_app):
    r = await client.post("/math/create", headers=owner.headers, json={"split": "test", "index": 0})
    assert "X-Session-ID" in assert_detail(r, 400)
    r = await client.post("/math/create", headers={**owner.headers, "X-Session-ID": "  "},
                          json={"split": "test", "index": 0})
    assert_detail(r, 400)
    assert ors_app.gateway.sessions == {}


async def test_create_without_env_name_uses_the_default_environment(client, owner):
    task = await math_task(client, owner, "test", 2)
    sid = str(uuid.uuid4())
    r = await client.post("/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 2})
    assert r.status_code == 200, r.text
    r = await client.get("/prompt", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert task["question"] in r.json()[0]["text"]
    r = await client.get("/version", headers=sid_headers(owner, sid))
    assert r.json()["environment"] == "builtin/math@1"


async def test_create_with_env_name_in_the_body_on_a_bare_path(client, owner):
    sid = str(uuid.uuid4())
    r = await client.post("/create", headers=sid_headers(owner, sid),
                          json={"env_name": "builtin/wordle", "split": "test", "index": 0})
    assert r.status_code == 200, r.text
    r = await client.get("/version", headers=sid_headers(owner, sid))
    assert r.json()["environment"] == "builtin/wordle@1"


async def test_create_uses_the_environment_a_key_is_bound_to(client, owner):
    from orsplatform.catalog.models import Environment
    from orsplatform.teams.services import api_key_create

    def bound_key() -> str:
        vision = Environment.objects.get(team__slug="builtin", slug="vision")
        return api_key_create(team=owner.team, name="bound", scopes=["sessions"], environment=vision).token

    token = await in_db(bound_key)
    sid = str(uuid.uuid4())
    r = await client.post("/create", headers={"X-API-Key": token, "X-Session-ID": sid},
                          json={"split": "test", "index": 0})
    assert r.status_code == 200, r.text
    r = await client.get("/version", headers={"X-API-Key": token, "X-Session-ID": sid})
    assert r.json()["environment"] == "builtin/vision@1"


async def test_create_with_an_unknown_environment_answers_404(client, owner):
    sid = str(uuid.uuid4())
    r = await client.post("/nosuchenv/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 0})
    assert_detail(r, 404)
    r = await client.post("/create", headers=sid_headers(owner, sid),
                          json={"env_name": "nosuchenv", "split": "test", "index": 0})
    assert_detail(r, 404)
    r = await client.post("/create", headers={**sid_headers(owner, sid), "X-Deployment": "builtin/nosuch"},
                          json={"split": "test", "index": 0})
    assert r.status_code == 404 and r.json()["detail"].startswith("Deployment not found: 'builtin/nosuch'.")
    assert await arow(sid) is None


async def test_create_through_x_deployment(client, owner):
    sid = str(uuid.uuid4())
    r = await client.post("/create", headers={**sid_headers(owner, sid), "X-Deployment": "builtin/vision"},
                          json={"split": "train", "index": 1})
    assert r.status_code == 200
    r = await client.get("/prompt", headers={**sid_headers(owner, sid), "X-Deployment": "builtin/vision"})
    assert r.status_code == 200
    assert [b["type"] for b in r.json()] == ["text", "image"]


# --- prompt and task_tools --------------------------------------------------------------------


async def test_prompt_returns_the_tasks_blocks(client, owner):
    task = await math_task(client, owner, "test", 9)
    sid = await start_episode(client, owner.headers, split="test", index=9)
    r = await client.get("/math/prompt", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    blocks = r.json()
    assert isinstance(blocks, list) and len(blocks) == 1
    assert blocks[0]["type"] == "text" and blocks[0]["detail"] is None
    assert task["question"] in blocks[0]["text"]


async def vision_tasks(client, person) -> list[dict]:
    r = await client.post("/vision/task_range", headers=person.headers, json={"split": "train", "stop": 40})
    assert r.status_code == 200
    return r.json()["tasks"]


async def test_task_tools_include_the_task_specific_tools_a_task_offers(client, owner):
    tasks = await vision_tasks(client, owner)
    index = next(i for i, t in enumerate(tasks) if t["zoomable"])
    sid = await start_episode(client, owner.headers, env="vision", split="train", index=index)
    r = await client.get("/vision/task_tools", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    tools = {t["name"]: t for t in r.json()["tools"]}
    assert "answer" in tools and "zoom" in tools
    assert ("hint" in tools) == bool(tasks[index].get("hint"))
    assert tools["zoom"]["input_schema"]["properties"]["factor"]["type"] == "integer"
    # The sessionless listing still has only the shared tool.
    r = await client.get("/vision/tools", headers=owner.headers)
    assert [t["name"] for t in r.json()["tools"]] == ["answer"]


async def test_task_tools_leave_out_tools_a_task_does_not_offer(client, owner):
    tasks = await vision_tasks(client, owner)
    index = next(i for i, t in enumerate(tasks) if not t["zoomable"] and not t.get("hint"))
    sid = await start_episode(client, owner.headers, env="vision", split="train", index=index)
    r = await client.get("/vision/task_tools", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert [t["name"] for t in r.json()["tools"]] == ["answer"]
    index = next(i for i, t in enumerate(tasks) if not t["zoomable"] and t.get("hint"))
    sid = await start_episode(client, owner.headers, env="vision", split="train", index=index)
    r = await client.get("/vision/task_tools", headers=sid_headers(owner, sid))
    assert sorted(t["name"] for t in r.json()["tools"]) == ["answer", "hint"]


# --- ping, delete, delete_session -------------------------------------------------------------


async def test_ping_answers_ok_for_an_open_session(client, owner):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/ping", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}
    r = await client.post("/math/ping", headers=sid_headers(owner, sid))
    assert r.status_code == 200


async def test_any_request_carrying_the_session_id_counts_as_activity(client, owner, ors_app):
    sid = await start_episode(client, owner.headers)
    live = ors_app.gateway.sessions[sid]
    h = sid_headers(owner, sid)
    for method, path, body in [("POST", "/ping", None), ("GET", "/math/prompt", None),
                               ("GET", "/math/task_tools", None),
                               ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}})]:
        live.last_activity -= 600
        before = live.last_activity
        r = await client.request(method, path, headers=h, json=body)
        assert r.status_code == 200, (path, r.text)
        assert live.last_activity > before + 500, path


async def test_delete_answers_with_the_sid_and_a_second_delete_is_not_an_error(client, owner):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/delete", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json() == {"sid": sid}
    row = await arow(sid)
    assert row["status"] == "deleted" and row["ended_at"] is not None
    r = await client.post("/delete", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json() == {"sid": sid}
    r = await client.post("/delete_session", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json() == {"sid": sid}
    assert (await arow(sid))["status"] == "deleted"


async def test_after_delete_session_endpoints_answer_410(client, owner, ors_app):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "1"}})
    task_id = parse_sse(r.text)[0][1]
    assert (await client.post("/delete", headers=sid_headers(owner, sid))).status_code == 200
    assert sid not in ors_app.gateway.sessions
    h = sid_headers(owner, sid)
    assert_detail(await client.post("/ping", headers=h), 410)
    assert_detail(await client.get("/math/prompt", headers=h), 410)
    assert_detail(await client.get("/math/task_tools", headers=h), 410)
    assert_detail(await client.post("/math/call", headers=h, json={"name": "submit", "input": {"answer": "1"}}), 410)
    assert_detail(await client.post("/math/call", headers=h, json={"task_id": task_id}), 410)
    assert len(await acalls(sid)) == 1


async def test_delete_session_ends_an_open_session(client, owner):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/delete_session", headers=sid_headers(owner, sid))
    assert r.status_code == 200 and r.json() == {"sid": sid}
    assert_detail(await client.post("/ping", headers=sid_headers(owner, sid)), 410)
    assert (await arow(sid))["status"] == "deleted"


async def test_unknown_sessions_answer_404(client, owner):
    h = sid_headers(owner, str(uuid.uuid4()))
    assert_detail(await client.post("/ping", headers=h), 404)
    assert_detail(await client.get("/math/prompt", headers=h), 404)
    assert_detail(await client.get("/math/task_tools", headers=h), 404)
    assert_detail(await client.post("/math/call", headers=h, json={"name": "submit", "input": {"answer": "1"}}), 404)
    assert_detail(await client.post("/math/call", headers=h, json={"task_id": uuid.uuid4().hex}), 404)
    assert_detail(await client.post("/delete", headers=h), 404)


async def test_a_sid_minted_by_create_session_is_unknown_until_create(client, owner):
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    assert_detail(await client.post("/ping", headers=sid_headers(owner, sid)), 404)
    assert_detail(await client.get("/math/prompt", headers=sid_headers(owner, sid)), 404)


async def test_delete_session_with_an_unknown_sid_answers_200(client, owner):
    sid = str(uuid.uuid4())
    r = await client.post("/delete_session", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json() == {"sid": sid}
    # A throwaway id from create_session, as the openreward client does.
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    r = await client.post("/delete_session", headers=sid_headers(owner, sid))
    assert r.status_code == 200 and r.json() == {"sid": sid}


async def test_session_endpoints_require_a_session_id(client, owner):
    for method, path, body in [("POST", "/ping", None), ("POST", "/delete", None), ("POST", "/delete_session", None),
                               ("GET", "/math/prompt", None), ("GET", "/math/task_tools", None),
                               ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}})]:
        r = await client.request(method, path, headers=owner.headers, json=body)
        assert "X-Session-ID" in assert_detail(r, 400), path


# --- expiry -----------------------------------------------------------------------------------


async def test_an_idle_session_is_reaped_and_then_answers_404_expired(client, owner, ors_app, settings):
    sid = await start_episode(client, owner.headers)
    other = await start_episode(client, owner.headers)
    assert settings.ORS_IDLE_TIMEOUT_SECONDS == 15 * 60  # the documented default
    settings.ORS_IDLE_TIMEOUT_SECONDS = 0
    await ors_app.gateway.reap_once()
    assert sid not in ors_app.gateway.sessions and other not in ors_app.gateway.sessions
    r = await client.post("/ping", headers=sid_headers(owner, sid))
    assert "expired" in assert_detail(r, 404).lower()
    r = await client.get("/math/prompt", headers=sid_headers(owner, sid))
    assert "expired" in assert_detail(r, 404).lower()
    row = await arow(sid)
    assert row["status"] == "expired" and row["ended_at"] is not None
    # Deleting an expired session is not an error, and it stays expired.
    r = await client.post("/delete", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert (await arow(sid))["status"] == "expired"


async def test_an_active_session_is_not_reaped(client, owner, ors_app, settings):
    sid = await start_episode(client, owner.headers)
    settings.ORS_IDLE_TIMEOUT_SECONDS = 60
    await ors_app.gateway.reap_once()
    assert (await client.post("/ping", headers=sid_headers(owner, sid))).status_code == 200
    assert (await arow(sid))["status"] in ("creating", "ready")


# --- setup ------------------------------------------------------------------------------------


async def test_requests_answer_503_while_setup_runs_and_200_once_it_is_done(client, owner, probe, settings):
    settings.ORS_SETUP_WAIT_SECONDS = 0.2
    created = time.monotonic()
    sid = await start_episode(client, owner.headers, env=probe, task_spec={"setup_sleep": 2, "question": "slow"})
    h = sid_headers(owner, sid)

    # /create answered before setup finished: the instance is still starting.
    r = await client.get(f"/{probe}/prompt", headers=h)
    assert_detail(r, 503)
    assert r.headers["x-backend-state"] == "starting"
    assert int(r.headers["retry-after"]) > 0
    r = await client.get(f"/{probe}/task_tools", headers=h)
    assert_detail(r, 503)
    assert r.headers["x-backend-state"] == "starting"
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "finish", "input": {}})
    assert_detail(r, 503)
    assert r.headers["x-backend-state"] == "starting" and r.headers["retry-after"]
    # Pinging does not wait for setup.
    assert (await client.post("/ping", headers=h)).status_code == 200
    assert await acalls(sid) == []

    async def prompt_ready():
        r = await client.get(f"/{probe}/prompt", headers=h)
        assert r.status_code in (200, 503), r.text
        return r if r.status_code == 200 else None

    r = await wait_for(prompt_ready, timeout=10, what="setup to finish")
    assert r.json()[0]["text"] == "slow"
    assert time.monotonic() - created >= 1.9
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "finish", "input": {}})
    assert sse_result(r.text)["ok"] is True


async def test_requests_wait_for_a_setup_that_finishes_within_the_bound(client, owner, probe, settings):
    settings.ORS_SETUP_WAIT_SECONDS = 10
    sid = await start_episode(client, owner.headers, env=probe, task_spec={"setup_sleep": 0.3, "question": "soon"})
    r = await client.get(f"/{probe}/prompt", headers=sid_headers(owner, sid))
    assert r.status_code == 200
    assert r.json()[0]["text"] == "soon"


async def test_a_setup_that_raises_answers_500_and_marks_the_session_failed(client, owner, probe):
    sid = await start_episode(client, owner.headers, env=probe, task_spec={"setup_fail": True})
    h = sid_headers(owner, sid)
    r = await client.get(f"/{probe}/prompt", headers=h)
    assert "setup failed" in assert_detail(r, 500).lower()
    assert "probe setup exploded" in r.json()["detail"]
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "finish", "input": {}})
    assert "setup failed" in assert_detail(r, 500).lower()
    r = await client.get(f"/{probe}/task_tools", headers=h)
    assert "setup failed" in assert_detail(r, 500).lower()

    async def failed():
        row = await arow(sid)
        return row if row["status"] == "failed" else None

    row = await wait_for(failed, what="the session row to be marked failed")
    assert "probe setup exploded" in row["error"]
    # A failed session can still be deleted.
    r = await client.post("/delete", headers=h)
    assert r.status_code == 200
    assert (await arow(sid))["status"] == "deleted"


async def test_deleting_a_session_while_setup_runs_ends_it_at_once(client, owner, probe, ors_app, settings):
    settings.ORS_SETUP_WAIT_SECONDS = 0.1
    sid = await start_episode(client, owner.headers, env=probe, task_spec={"setup_sleep": 30})
    h = sid_headers(owner, sid)
    assert (await client.get(f"/{probe}/prompt", headers=h)).status_code == 503
    loop = asyncio.get_running_loop()
    started = loop.time()
    r = await client.post("/delete", headers=h)
    assert r.status_code == 200 and r.json() == {"sid": sid}
    assert loop.time() - started < 5
    assert_detail(await client.get(f"/{probe}/prompt", headers=h), 410)
    # Once the gateway's background work settles, the row says deleted (not failed).
    await wait_for(lambda: not ors_app.gateway._background, what="background tasks to finish")
    row = await arow(sid)
    assert row["status"] == "deleted"
    assert_detail(await client.post("/ping", headers=h), 410)


async def test_the_session_row_is_marked_ready_when_activity_is_flushed(client, owner, ors_app):
    sid = await start_episode(client, owner.headers)
    assert (await client.get("/math/prompt", headers=sid_headers(owner, sid))).status_code == 200
    await wait_for(lambda: ors_app.gateway.sessions[sid].ready_at is not None, what="setup to be noted")
    await ors_app.gateway.flush_activity()
    row = await arow(sid)
    assert row["status"] == "ready" and row["ready_at"] is not None


async def test_a_per_environment_host_name_chooses_the_environment_of_a_session_that_names_none(client, owner):
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid, "Host": "wordle.ors.example.com"}
    r = await client.post("/create", headers=headers, json={"split": "train", "index": 0})
    assert r.status_code == 200
    r = await client.get("/version", headers=headers)
    assert r.json()["environment"].startswith("builtin/wordle@")


async def test_a_host_name_that_names_no_environment_falls_back_to_the_default(client, owner):
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid, "Host": "ors.example.com"}
    assert (await client.post("/create", headers=headers, json={"split": "train", "index": 0})).status_code == 200
    # Nothing names an environment, not even the session's first request: the default it is.
    assert (await client.get("/prompt", headers=headers)).status_code == 200
    assert (await client.get("/version", headers=headers)).json()["environment"].startswith("builtin/math@")


async def test_addressing_a_session_through_another_environment_is_a_404_not_a_silent_mixup(client, owner):
    sid = await start_episode(client, owner.headers, env="math")
    r = await client.get("/wordle/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 404 and "builtin/math" in r.json()["detail"]
    r = await client.get("/nosuchenv/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 200  # a path that names no environment is ignored, as in the reference


async def test_a_session_opened_over_ors_records_its_protocol(client, owner):
    sid = await start_episode(client, owner.headers)
    assert (await arow(sid))["protocol"] == "ors"


async def test_a_create_naming_no_environment_binds_on_the_first_request_that_names_one(client, owner, ors_app):
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid}
    assert (await client.post("/create", headers=headers, json={"split": "test", "index": 3})).status_code == 200
    assert await arow(sid) is None  # nothing recorded, nothing started: no environment is known yet
    assert (await client.post("/ping", headers=headers)).json() == {"status": "ok"}
    # Concurrent first requests bind it once.
    first, second = await asyncio.gather(client.get("/wordle/prompt", headers=headers),
                                         client.get("/wordle/task_tools", headers=headers))
    assert first.status_code == 200 and second.status_code == 200, (first.text, second.text)
    row = await arow(sid)
    assert row["task_index"] == 3 and row["environment_id"] == ors_app.gateway.sessions[sid].env.environment_id
    assert ors_app.gateway.sessions[sid].env.full_name == "builtin/wordle"
    assert (await client.get("/math/prompt", headers=headers)).status_code == 404  # bound now
    assert await acount() == 1


async def test_a_deferred_session_with_a_split_its_environment_lacks_answers_400_on_binding(client, owner):
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid}
    assert (await client.post("/create", headers=headers, json={"split": "nosuch", "index": 0})).status_code == 200
    r = await client.get("/math/prompt", headers=headers)
    assert r.status_code == 400 and r.json() == {"detail": "Invalid split 'nosuch'; the splits of builtin/math are: train, test."}
    assert await arow(sid) is None
    assert (await client.post("/delete", headers=headers)).status_code == 200
    assert (await client.get("/math/prompt", headers=headers)).status_code == 404
