"""Secrets of a session: every way of sending one reaches the environment, none is stored, and values
the environment's code echoes are redacted before anything is written."""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.ors import parse_sse, sse_result, start_episode
from tests.ors.support import all_rows_dump, arow, assert_detail, in_db, sid_headers, wait_for, x_secrets


async def test_secrets_from_the_body_x_secrets_and_create_session_all_reach_the_environment(client, owner):
    canaries = {name: f"canary-{name}-{uuid.uuid4().hex}" for name in ("body_key", "header_key", "session_key")}
    r = await client.post("/create_session", headers={
        **owner.headers, "Accept": "text/event-stream",
        "X-Secrets": x_secrets({"session_key": {"value": canaries["session_key"], "allowed_domains": ["x.test"]}})})
    sid = parse_sse(r.text)[0][1]
    r = await client.post("/math/create", headers={
        **sid_headers(owner, sid),
        "X-Secrets": x_secrets({"header_key": {"value": canaries["header_key"], "allowed_domains": []}})},
        json={"split": "test", "index": 0, "secrets": {"body_key": canaries["body_key"]}})
    assert r.status_code == 200, r.text
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "0"}})
    result = sse_result(r.text)
    assert result["output"]["metadata"]["secrets_seen"] == ["body_key", "header_key", "session_key"]
    # Delivered, never stored: no Session or ToolCall column holds a value.
    await client.post("/delete", headers=sid_headers(owner, sid))
    dump = await in_db(all_rows_dump)
    assert sid in dump
    for value in canaries.values():
        assert value not in dump
    for value in canaries.values():
        assert value not in r.text


@pytest.mark.parametrize("where", ["body", "body-object", "x-secrets-create", "x-secrets-create-session"])
async def test_each_way_of_sending_a_secret_reaches_the_environment_and_is_not_stored(client, owner, where):
    value = f"canary-{uuid.uuid4().hex}"
    create_session_headers = dict(owner.headers)
    create_headers: dict[str, str] = {}
    body: dict = {"split": "test", "index": 0}
    if where == "body":
        body["secrets"] = {"canary": value}
    elif where == "body-object":
        body["secrets"] = {"canary": {"value": value, "allowed_domains": ["api.test"]}}
    elif where == "x-secrets-create":
        create_headers["X-Secrets"] = x_secrets({"canary": {"value": value}})
    else:
        create_session_headers["X-Secrets"] = x_secrets({"canary": {"value": value}})
    sid = (await client.post("/create_session", headers=create_session_headers)).json()["sid"]
    r = await client.post("/math/create", headers={**sid_headers(owner, sid), **create_headers}, json=body)
    assert r.status_code == 200, r.text
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == ["canary"]
    dump = await in_db(all_rows_dump)
    assert sid in dump and value not in dump


async def test_a_session_without_secrets_sees_none(client, owner):
    sid = await start_episode(client, owner.headers)
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == []


async def test_secrets_sent_with_create_session_survive_a_create_rejected_for_capacity(client, owner):
    from orsplatform.teams.auth import key_cache

    def limit_acme() -> None:
        type(owner.team).objects.filter(pk=owner.team.pk).update(max_open_sessions=1)

    await in_db(limit_acme)
    key_cache.clear()
    first = await start_episode(client, owner.headers)
    r = await client.post("/create_session", headers={**owner.headers,
                                                      "X-Secrets": x_secrets({"canary": {"value": "v"}})})
    sid = r.json()["sid"]
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 0})
    assert "maximum capacity" in assert_detail(r, 429)
    assert int(r.headers["retry-after"]) > 0
    assert await arow(sid) is None
    # The client frees a slot and retries the same /create, as clients do after a 429.
    assert (await client.post("/delete", headers=sid_headers(owner, first))).status_code == 200
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "test", "index": 0})
    assert r.status_code == 200, r.text
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == ["canary"]


async def test_secret_values_echoed_by_environment_code_are_not_stored(client, owner, probe):
    value = f"canary-{uuid.uuid4().hex}"
    header = {"X-Secrets": x_secrets({"canary": {"value": value}})}
    sid = (await client.post("/create_session", headers={**owner.headers, **header})).json()["sid"]
    r = await client.post(f"/{probe}/create", headers=sid_headers(owner, sid), json={"task_spec": {}})
    assert r.status_code == 200
    h = sid_headers(owner, sid)
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "reveal", "input": {}})
    assert sse_result(r.text)["ok"] is True
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "reveal_raise", "input": {}})
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    assert len(errors) == 1 and "failed with secrets" in errors[0]
    assert value not in errors[0]
    # The agent itself passes the value as tool input.
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "count", "input": {"n": 1, "note": value}})
    assert sse_result(r.text)["ok"] is True
    failing = str(uuid.uuid4())
    r = await client.post(f"/{probe}/create", headers={**sid_headers(owner, failing), **header},
                          json={"task_spec": {"setup_fail_reveal": True}})
    assert r.status_code == 200
    r = await client.get(f"/{probe}/prompt", headers=sid_headers(owner, failing))
    assert "setup failed" in assert_detail(r, 500).lower()
    assert value not in r.text
    await wait_for(lambda: arow(failing), what="the failed session row")

    async def marked_failed():
        return (await arow(failing))["status"] == "failed"

    await wait_for(marked_failed, what="the session row to be marked failed")
    await client.post("/delete", headers=h)
    dump = await in_db(all_rows_dump)
    assert sid in dump and failing in dump and "failed with secrets" in dump and "probe setup exploded" in dump
    assert value not in dump
