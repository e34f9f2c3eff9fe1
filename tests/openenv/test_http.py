"""The OpenEnv face's HTTP routes in process: /health, /metadata, /schema, the stateless /reset /step
/state with OpenEnv's 422 shapes, the task routes, and /mcp's JSON-RPC sessions and errors."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from orsplatform.episodes.models import Session, ToolCall

MATH = "/openenv/builtin/math"


def rpc(method: str, params: dict | None = None, id_: int = 1) -> dict:
    body = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        body["params"] = params
    return body


async def test_health_metadata_and_schema_describe_the_environment(client, owner):
    assert (await client.get(f"{MATH}/health")).json() == {"status": "healthy"}
    meta = (await client.get(f"{MATH}/metadata", headers=owner.headers)).json()
    assert meta["name"] == "builtin/math" and meta["version"] == "1"
    assert meta["description"].startswith("Generated arithmetic") and meta["author"]
    assert "math" in meta["readme_content"].lower()
    schema = (await client.get(f"{MATH}/schema")).json()
    assert set(schema) == {"action", "observation", "reset_observation", "state"}
    submit = schema["action"]["anyOf"][0]
    assert submit["properties"]["tool_name"] == {"const": "submit"}
    assert "answer" in submit["properties"]["arguments"]["properties"]
    assert {"tool_name", "result", "error", "reward", "done"} <= set(schema["observation"]["properties"])


async def test_the_stateless_reset_opens_records_and_ends_one_episode(client, owner):
    r = await client.post(f"{MATH}/reset", headers=owner.headers, json={"split": "test", "index": 3, "seed": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["done"] is False and body["reward"] is None
    assert body["observation"]["metadata"]["task_spec"]["id"] == "test-3"
    session = await sync_to_async(Session.objects.get)()
    assert session.protocol == Session.Protocol.OPENENV and session.status == Session.Status.DELETED


async def test_reset_step_and_state_answer_openenvs_validation_shapes(client, owner):
    r = await client.post(f"{MATH}/reset", headers=owner.headers, json={"seed": -1})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "seed"] and r.json()["detail"][0]["type"] == "greater_than_equal"
    r = await client.post(f"{MATH}/step", headers=owner.headers, json={})
    assert r.status_code == 422 and r.json()["detail"][0] == {
        "type": "missing", "loc": ["body", "action"], "msg": "Field required", "input": {}}
    r = await client.post(f"{MATH}/step", headers=owner.headers, json={"action": {"bogus": 1}})
    assert r.status_code == 422 and {e["loc"][0] for e in r.json()["detail"]} == {"tool_name", "bogus"}
    r = await client.post(f"{MATH}/step", headers=owner.headers, content=b"{nope")
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    listed = (await client.post(f"{MATH}/step", headers=owner.headers, json={"action": {"type": "list_tools"}})).json()
    assert [t["name"] for t in listed["observation"]["tools"]] == ["submit"]
    r = await client.post(f"{MATH}/step", headers=owner.headers,
                          json={"action": {"tool_name": "submit", "arguments": {"answer": "1"}}})
    assert r.status_code == 400 and "reset()" in r.json()["detail"]
    state = (await client.get(f"{MATH}/state")).json()
    assert state["step_count"] == 0 and state["episode_id"]
    assert (await client.get(f"{MATH}/reset")).status_code == 405
    assert (await client.post(f"{MATH}/reset", json={})).status_code == 401  # sessions need a key


async def test_the_task_routes_answer_under_the_prefix_and_with_the_env_name(client, owner):
    assert (await client.get(f"{MATH}/list_environments")).json() == ["math"]
    splits = [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]
    assert (await client.get(f"{MATH}/splits")).json() == splits
    assert (await client.get(f"{MATH}/math/splits")).json() == splits
    assert (await client.get(f"{MATH}/other/splits")).status_code == 404
    assert (await client.post(f"{MATH}/math/num_tasks", json={"split": "test"})).json() == {"num_tasks": 1000}
    task = (await client.post(f"{MATH}/task", json={"split": "test", "index": 4})).json()
    assert task["task"]["id"] == "test-4"
    window = (await client.post(f"{MATH}/task_range", json={"split": "test", "start": -2})).json()
    assert [t["id"] for t in window["tasks"]] == ["test-998", "test-999"]
    tasks = (await client.post(f"{MATH}/tasks", json={"split": "test"})).json()
    assert len(tasks["tasks"]) == 1000 and tasks["env_name"] == "math"
    assert (await client.post(f"{MATH}/task", json={"split": "test", "index": 1000})).status_code == 400
    assert (await client.post(f"{MATH}/task", json={"split": "nope", "index": 0})).status_code == 400
    r = await client.post(f"{MATH}/task", json={"split": "test"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "index"]
    assert (await client.get("/openenv/builtin/nothing/splits")).status_code == 404


async def test_mcp_sessions_list_call_and_close_over_json_rpc(client, owner):
    headers = owner.headers
    created = (await client.post(f"{MATH}/mcp", headers=headers, json=rpc(
        "openenv/session/create", {"split": "test", "index": 5}))).json()
    sid = created["result"]["session_id"]
    listed = (await client.post(f"{MATH}/mcp", headers=headers, json=rpc("tools/list", {"session_id": sid}))).json()
    assert [t["name"] for t in listed["result"]["tools"]] == ["submit"]
    called = (await client.post(f"{MATH}/mcp", headers=headers, json=rpc(
        "tools/call", {"name": "submit", "arguments": {"answer": "0"}, "session_id": sid}, 2))).json()
    assert called["id"] == 2 and called["result"]["done"] is True and called["result"]["reward"] == 0.0
    closed = (await client.post(f"{MATH}/mcp", headers=headers, json=rpc("openenv/session/close",
                                                                           {"session_id": sid}))).json()
    assert closed["result"] == {"session_id": sid, "closed": True}
    session = await sync_to_async(Session.objects.get)()
    assert session.status == Session.Status.DELETED and session.protocol == Session.Protocol.OPENENV
    assert await sync_to_async(ToolCall.objects.count)() == 1


async def test_mcp_answers_json_rpc_errors_for_what_it_does_not_serve(client, owner):
    async def ask(body) -> dict:
        r = await client.post(f"{MATH}/mcp", headers=owner.headers,
                              **({"content": body} if isinstance(body, bytes) else {"json": body}))
        assert r.status_code == 200
        return r.json()

    assert (await ask(b"{nope"))["error"]["code"] == -32700
    assert (await ask({"id": 1, "method": "tools/list"}))["error"]["code"] == -32600
    assert (await ask(rpc("initialize")))["error"]["code"] == -32601
    assert (await ask(rpc("tools/list", [])))["error"]["code"] == -32602  # type: ignore[arg-type]
    assert (await ask(rpc("tools/call", {"arguments": {}})))["error"]["code"] == -32602
    no_session = await ask(rpc("tools/call", {"name": "submit", "arguments": {}}))
    assert no_session["error"]["code"] == -32603 and "reset()" in no_session["error"]["message"]
    assert (await ask(rpc("tools/list", {"session_id": "nope"})))["error"]["code"] == -32602
    assert (await ask(rpc("openenv/session/close", {})))["error"]["code"] == -32602
    # A session-less tools/list is discovery: anyone who may read the catalog.
    anonymous = (await client.post(f"{MATH}/mcp", json=rpc("tools/list"))).json()
    assert [t["name"] for t in anonymous["result"]["tools"]] == ["submit"]
    assert (await client.post(f"{MATH}/mcp", json=rpc("openenv/session/create"))).status_code == 401


async def test_openenv_sessions_appear_in_the_explorer_api_and_the_exports_with_their_protocol(client, owner):
    reset = (await client.post(f"{MATH}/reset", headers=owner.headers, json={"split": "test", "index": 1})).json()
    sid = reset["observation"]["metadata"]["session_id"]
    listed = await client.get("/api/v1/analytics/sessions", headers=owner.headers)
    assert listed.status_code == 200 and [s["sid"] for s in listed.json()["sessions"]] == [sid]
    assert listed.json()["sessions"][0]["protocol"] == "openenv"
    # The explorer filters by protocol, and says which ones there are when given another.
    only = await client.get("/api/v1/analytics/sessions?protocol=openenv", headers=owner.headers)
    assert [s["sid"] for s in only.json()["sessions"]] == [sid]
    other = await client.get("/api/v1/analytics/sessions?protocol=ors", headers=owner.headers)
    assert other.status_code == 200 and other.json()["sessions"] == []
    bad = await client.get("/api/v1/analytics/sessions?protocol=gopher", headers=owner.headers)
    assert bad.status_code == 400 and "openenv" in str(bad.json()["detail"])
    page = await sync_to_async(_explorer_page)(owner, "?protocol=openenv")
    assert page.status_code == 200
    assert sid[:15] in page.content.decode() and "<td>openenv</td>" in page.content.decode()
    trajectory = await client.get(f"/api/v1/analytics/sessions/{sid}", headers=owner.headers)
    assert trajectory.status_code == 200 and sid in trajectory.text
    detail = await client.get(f"/api/v1/sessions/{sid}", headers=owner.headers)
    assert detail.status_code == 200 and detail.json()["protocol"] == "openenv"
    export = await client.get("/api/v1/analytics/export.jsonl", headers=owner.headers)
    rows = [line for line in export.text.splitlines() if sid in line]
    assert len(rows) == 1 and '"protocol":"openenv"' in rows[0].replace(" ", "")


def _explorer_page(person, query: str):
    """The session explorer as the team's owner sees it in a browser session."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    browser = Client()
    browser.force_login(get_user_model().objects.get(username=person.username))
    return browser.get(f"/analytics/{person.team.slug}/sessions/{query}")
