"""Tenancy and authentication over every ORS endpoint.

The table test runs each endpoint as the session's owner, a member of the same team (whose key has
only the `sessions` scope), an outsider (another team) and an anonymous caller, against a session
the owner created on the owner's team's private environment and on the public builtin/math."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.fixtures.ors import parse_sse, sse_result, start_episode
from tests.ors.support import PROBE, acalls, arow, in_db, publish_probe_sync

PEOPLE = ["owner", "member", "outsider", "anonymous"]

# How each target is used: where its session is created, and a tool call that does not fail.
TARGETS = {
    "private": {"env": PROBE, "create": {"split": "train", "index": 1}, "tool": ("count", {"n": 4})},
    "public": {"env": "builtin/math", "create": {"split": "test", "index": 1}, "tool": ("submit", {"answer": "0"})},
}


def expected_status(endpoint: str, who: str, target: str) -> int:
    same_team = who in ("owner", "member")
    if endpoint in ("health", "version", "list_environments"):
        return 200
    if endpoint in ("tools", "splits", "tasks", "num_tasks", "task", "task_range"):
        return 200 if same_team or target == "public" else 404
    if who == "anonymous":
        return 401  # ORS_ANONYMOUS_SESSIONS is off by default
    if endpoint in ("create_session", "delete_session"):
        return 200
    if endpoint == "create":
        return 200 if same_team or target == "public" else 404
    # ping, prompt, task_tools, call, call_reconnect, delete: the owner's session itself
    return 200 if same_team else 404


def is_detail(r) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    return (r.headers.get("content-type") == "application/json" and isinstance(body, dict)
            and set(body) == {"detail"} and isinstance(body["detail"], str) and bool(body["detail"]))


def endpoints(env: str, cfg: dict, auth: dict, h: dict, task_id: str) -> list[tuple]:
    """Every ORS endpoint as (name, method, path, headers, body); ``h`` carries the owner's session id."""
    tool_name, tool_input = cfg["tool"]
    split = cfg["create"]["split"]
    return [
        ("health", "GET", "/health", auth, None),
        ("version", "GET", "/version", h, None),
        ("list_environments", "GET", "/list_environments", auth, None),
        ("tools", "GET", f"/{env}/tools", auth, None),
        ("splits", "GET", f"/{env}/splits", auth, None),
        ("tasks", "POST", f"/{env}/tasks", auth, {"split": split}),
        ("num_tasks", "POST", f"/{env}/num_tasks", auth, {"split": split}),
        ("task", "POST", f"/{env}/task", auth, {"split": split, "index": 0}),
        ("task_range", "POST", f"/{env}/task_range", auth, {"split": split, "start": 0, "stop": 2}),
        ("create_session", "POST", "/create_session", auth, None),
        ("create", "POST", f"/{env}/create", {**auth, "X-Session-ID": str(uuid.uuid4())}, cfg["create"]),
        ("ping", "POST", "/ping", h, None),
        ("prompt", "GET", f"/{env}/prompt", h, None),
        ("task_tools", "GET", f"/{env}/task_tools", h, None),
        ("call", "POST", f"/{env}/call", h, {"name": tool_name, "input": tool_input}),
        ("call_reconnect", "POST", f"/{env}/call", h, {"task_id": task_id}),
        ("delete", "POST", "/delete", h, None),
        ("delete_session", "POST", "/delete_session", h, None),
    ]


def what_the_200s_carry(answers: dict, first, who: str, target: str, env: str) -> list[str]:
    problems = []
    same_team = who in ("owner", "member")
    version_env = answers["version"].json()["environment"]
    if version_env != (f"{env}@1" if same_team else None):
        problems.append(f"version: reveals environment {version_env!r} of another team's session to {who}")
    listed = answers["list_environments"].json()
    if (PROBE in listed) != same_team and target == "private":
        problems.append(f"list_environments: {listed}")
    if same_team:
        if sse_result(answers["call_reconnect"].text) != sse_result(first.text):
            problems.append("call_reconnect: not the original result")
        if not isinstance(answers["prompt"].json(), list):
            problems.append("prompt: not a list of blocks")
    return problems


async def unlike_an_unknown_session(client, answers: dict, auth: dict, env: str, cfg: dict, task_id: str) -> list[str]:
    """Another team's session must look exactly like a session that does not exist."""
    problems = []
    tool_name, tool_input = cfg["tool"]
    unknown = {**auth, "X-Session-ID": str(uuid.uuid4())}
    for name, method, path, body in [("ping", "POST", "/ping", None), ("prompt", "GET", f"/{env}/prompt", None),
                                     ("task_tools", "GET", f"/{env}/task_tools", None),
                                     ("call", "POST", f"/{env}/call", {"name": tool_name, "input": tool_input}),
                                     ("call_reconnect", "POST", f"/{env}/call", {"task_id": task_id}),
                                     ("delete", "POST", "/delete", None)]:
        r = await client.request(method, path, headers=unknown, json=body)
        if (r.status_code, r.content) != (answers[name].status_code, answers[name].content):
            problems.append(f"{name}: differs from an unknown session: {answers[name].text} vs {r.text}")
    return problems


async def the_owners_session_after(client, owner_h: dict, sid: str, who: str, target: str, env: str,
                                   cfg: dict) -> list[str]:
    """Ended by its own team's delete, untouched by anyone else."""
    problems = []
    tool_name, tool_input = cfg["tool"]
    r = await client.post("/ping", headers=owner_h)
    calls = await acalls(sid)
    if who in ("owner", "member"):
        if r.status_code != 410:
            problems.append(f"after delete by {who}: owner's ping answers {r.status_code}")
        if len(calls) != 2:
            problems.append(f"{who}'s call was not recorded on the session: {len(calls)} calls")
        return problems
    if r.status_code != 200:
        problems.append(f"{who} ended the owner's session: ping answers {r.status_code} {r.text}")
    if len(calls) != 1:
        problems.append(f"{who} made calls on the owner's session: {len(calls)} calls")
    row = await arow(sid)
    if row["status"] not in ("creating", "ready"):
        problems.append(f"{who} changed the owner's session row to {row['status']}")
    r = await client.post(f"/{env}/call", headers=owner_h, json={"name": tool_name, "input": tool_input})
    if not sse_result(r.text).get("ok") and target == "private":
        problems.append(f"owner cannot call after {who}'s requests: {r.text[:200]}")
    return problems


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("who", PEOPLE)
async def test_every_endpoint_answers_each_caller_according_to_its_team(
        client, ors_app, owner, member, outsider, tmp_path, who, target):
    if target == "private":
        await in_db(publish_probe_sync, owner.team, tmp_path)
    cfg = TARGETS[target]
    env = cfg["env"]
    tool_name, tool_input = cfg["tool"]
    person = {"owner": owner, "member": member, "outsider": outsider, "anonymous": None}[who]
    auth = person.headers if person is not None else {}

    # The owner's session, with one call already made.
    sid = await start_episode(client, owner.headers, env=env, **cfg["create"])
    owner_h = {**owner.headers, "X-Session-ID": sid}
    first = await client.post(f"/{env}/call", headers=owner_h, json={"name": tool_name, "input": tool_input})
    task_id = parse_sse(first.text)[0][1]
    assert sse_result(first.text)["ok"] is True

    problems: list[str] = []
    answers = {}
    for name, method, path, headers, body in endpoints(env, cfg, auth, {**auth, "X-Session-ID": sid}, task_id):
        r = await client.request(method, path, headers=headers, json=body)
        answers[name] = r
        want = expected_status(name, who, target)
        if r.status_code != want:
            problems.append(f"{name}: {r.status_code} (want {want}) {r.text[:200]}")
            continue
        if want != 200 and not is_detail(r):
            problems.append(f"{name}: {want} without a JSON {{'detail'}} body: {r.text[:200]}")

    problems += what_the_200s_carry(answers, first, who, target, env)
    if who == "outsider":
        problems += await unlike_an_unknown_session(client, answers, auth, env, cfg, task_id)
    problems += await the_owners_session_after(client, owner_h, sid, who, target, env, cfg)
    assert not problems, "\n".join(problems)


async def test_version_does_not_reveal_another_teams_session_environment(client, owner, outsider, probe):
    sid = await start_episode(client, owner.headers, env=probe, split="train", index=0)
    r = await client.get("/version", headers={**owner.headers, "X-Session-ID": sid})
    assert r.json()["environment"] == f"{probe}@1"
    for headers in (outsider.headers, {}):
        r = await client.get("/version", headers={**headers, "X-Session-ID": sid})
        assert r.status_code == 200
        assert r.json()["environment"] is None, f"/version revealed {r.json()['environment']!r}"


async def test_anonymous_callers_read_the_public_catalog_but_not_private_environments(client, probe):
    r = await client.get("/list_environments")
    assert r.status_code == 200 and PROBE not in r.json() and "builtin/math" in r.json()
    assert (await client.get("/math/splits")).status_code == 200
    assert (await client.post("/builtin/math/task", json={"split": "test", "index": 0})).status_code == 200
    r = await client.get(f"/{PROBE}/splits")
    assert r.status_code == 404 and is_detail(r)
    r = await client.get("/splits", headers={"X-Deployment": PROBE})
    assert r.status_code == 404 and r.json() == {
        "detail": f"Deployment not found: {PROBE!r}. No environment this key may use has a similar name."}


async def test_anonymous_catalog_access_can_be_switched_off(client, settings):
    settings.ORS_ANONYMOUS_CATALOG = False
    for method, path, body in [("GET", "/list_environments", None), ("GET", "/math/splits", None),
                               ("POST", "/math/num_tasks", {"split": "test"})]:
        r = await client.request(method, path, json=body)
        assert r.status_code == 401 and is_detail(r)
    assert (await client.get("/health")).status_code == 200


async def test_anonymous_session_endpoints_answer_401(client, owner):
    sid = await start_episode(client, owner.headers)
    for method, path, body in [("POST", "/create_session", None),
                               ("POST", "/math/create", {"split": "test", "index": 0}),
                               ("POST", "/ping", None), ("GET", "/math/prompt", None), ("GET", "/math/task_tools", None),
                               ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}}),
                               ("POST", "/delete", None), ("POST", "/delete_session", None)]:
        r = await client.request(method, path, headers={"X-Session-ID": sid}, json=body)
        assert r.status_code == 401 and is_detail(r), (path, r.text)
    assert (await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200


async def test_delete_session_by_another_team_is_a_no_op(client, owner, outsider, probe):
    sid = await start_episode(client, owner.headers, env=probe, split="train", index=0)
    r = await client.post("/delete_session", headers={**outsider.headers, "X-Session-ID": sid})
    assert r.status_code == 200 and r.json() == {"sid": sid}
    r = await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 200
    assert (await client.get(f"/{probe}/prompt", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200
    assert (await arow(sid))["status"] in ("creating", "ready")


def x_secrets(secrets: dict) -> str:
    return base64.b64encode(json.dumps(secrets).encode()).decode()


async def test_secrets_sent_with_create_session_never_reach_another_teams_session(client, owner, outsider):
    value = f"canary-{uuid.uuid4().hex}"
    r = await client.post("/create_session", headers={**owner.headers, "X-Secrets": x_secrets({"canary": {"value": value}})})
    sid = r.json()["sid"]
    # Another team cannot discard them...
    r = await client.post("/delete_session", headers={**outsider.headers, "X-Session-ID": sid})
    assert r.status_code == 200
    # ...and does not get them if it uses the id first.
    r = await client.post("/math/create", headers={**outsider.headers, "X-Session-ID": sid},
                          json={"split": "test", "index": 0})
    if r.status_code == 200:
        r = await client.post("/math/call", headers={**outsider.headers, "X-Session-ID": sid},
                              json={"name": "submit", "input": {"answer": "0"}})
        assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == []
    else:
        assert 400 <= r.status_code < 500 and is_detail(r)


async def test_create_session_secrets_survive_another_teams_delete_session(client, owner, outsider):
    r = await client.post("/create_session", headers={**owner.headers, "X-Secrets": x_secrets({"canary": {"value": "v"}})})
    sid = r.json()["sid"]
    await client.post("/delete_session", headers={**outsider.headers, "X-Session-ID": sid})
    r = await client.post("/math/create", headers={**owner.headers, "X-Session-ID": sid}, json={"split": "test", "index": 0})
    assert r.status_code == 200
    r = await client.post("/math/call", headers={**owner.headers, "X-Session-ID": sid},
                          json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == ["canary"]


# --- keys -------------------------------------------------------------------------------------

AUTHED = [
    ("GET", "/list_environments", None),
    ("GET", "/math/splits", None),
    ("POST", "/math/task", {"split": "test", "index": 0}),
    ("POST", "/create_session", None),
    ("POST", "/math/create", {"split": "test", "index": 0}),
    ("POST", "/ping", None),
    ("GET", "/math/prompt", None),
    ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}}),
    ("POST", "/delete", None),
    ("POST", "/delete_session", None),
]


async def assert_all_401(client, headers: dict, sid: str) -> None:
    for method, path, body in AUTHED:
        r = await client.request(method, path, headers={**headers, "X-Session-ID": sid}, json=body)
        assert r.status_code == 401, (headers, path, r.status_code, r.text)
        assert is_detail(r), (headers, path, r.text)
    # /health needs no key at all.
    r = await client.get("/health", headers=headers)
    assert r.status_code == 200


def new_key(team, **kwargs):
    from orsplatform.teams.services import api_key_create

    return api_key_create(team=team, name=f"key-{uuid.uuid4().hex[:6]}", **kwargs)


MALFORMED_KEYS = ["not-a-key", "", "ors_1234_5678", "ors_0123456g_" + "0" * 32, "ors_deadbeef_" + "0" * 31,
                  "x" * 500, "ors_deadbeef_" + "0" * 32 + " extra", "ORS_DEADBEEF_" + "0" * 32]


async def test_a_malformed_key_answers_401(client, owner):
    sid = await start_episode(client, owner.headers)
    for token in MALFORMED_KEYS:
        await assert_all_401(client, {"X-API-Key": token}, sid)
    assert (await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200


async def test_an_unknown_key_answers_401(client, owner):
    sid = await start_episode(client, owner.headers)
    prefix, secret = owner.token.split("_")[1:]
    await assert_all_401(client, {"X-API-Key": f"ors_{prefix}_{'0' * 32}"}, sid)  # known prefix, wrong secret
    await assert_all_401(client, {"X-API-Key": f"ors_{'0' * 8}_{secret}"}, sid)  # unknown prefix


async def test_a_revoked_key_answers_401(client, owner):
    from orsplatform.teams.auth import key_cache
    from orsplatform.teams.services import api_key_revoke

    new = await in_db(new_key, owner.team, scopes=["sessions"])
    headers = {"X-API-Key": new.token}
    sid = await start_episode(client, headers)
    assert (await client.post("/ping", headers={**headers, "X-Session-ID": sid})).status_code == 200
    await in_db(api_key_revoke, api_key=new.api_key)
    key_cache.clear()
    await assert_all_401(client, headers, sid)
    # The team's other keys still reach the session.
    assert (await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200


async def test_an_expired_key_answers_401(client, owner):
    new = await in_db(new_key, owner.team, scopes=["sessions"],
                                       expires_at=timezone.now() - timedelta(minutes=1))
    sid = await start_episode(client, owner.headers)
    await assert_all_401(client, {"X-API-Key": new.token}, sid)


async def test_a_key_that_is_not_yet_expired_works(client, owner):
    new = await in_db(new_key, owner.team, scopes=["sessions"],
                                       expires_at=timezone.now() + timedelta(hours=1))
    sid = await start_episode(client, {"X-API-Key": new.token})
    assert (await client.post("/ping", headers={"X-API-Key": new.token, "X-Session-ID": sid})).status_code == 200


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
async def test_an_authorization_bearer_key_works(client, owner, probe, scheme):
    headers = {"Authorization": f"{scheme} {owner.token}"}
    r = await client.get("/list_environments", headers=headers)
    assert r.status_code == 200 and PROBE in r.json()
    assert (await client.get(f"/{probe}/splits", headers=headers)).status_code == 200
    sid = await start_episode(client, headers, env=probe, split="train", index=0)
    h = {**headers, "X-Session-ID": sid}
    assert (await client.post("/ping", headers=h)).status_code == 200
    r = await client.post(f"/{probe}/call", headers=h, json={"name": "count", "input": {"n": 1}})
    assert sse_result(r.text)["ok"] is True
    # The same session as with X-API-Key.
    assert (await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200
    assert (await client.post("/delete", headers=h)).json() == {"sid": sid}


async def test_an_authorization_header_that_is_not_bearer_answers_401(client, owner):
    sid = await start_episode(client, owner.headers)
    for value in ["Basic x", "Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Token abc", "x",
                  f"Basic {owner.token}", f"Digest {owner.token}"]:
        await assert_all_401(client, {"Authorization": value}, sid)


async def test_a_bad_bearer_key_answers_401(client, owner):
    sid = await start_episode(client, owner.headers)
    await assert_all_401(client, {"Authorization": "Bearer ors_deadbeef_" + "0" * 32}, sid)


async def test_a_key_without_the_sessions_scope_answers_403_on_session_endpoints(client, owner):
    new = await in_db(new_key, owner.team, scopes=["publish"])
    sid = await start_episode(client, owner.headers)
    headers = {"X-API-Key": new.token, "X-Session-ID": sid}
    r = await client.post("/math/create", headers={**headers, "X-Session-ID": str(uuid.uuid4())},
                          json={"split": "test", "index": 0})
    assert r.status_code == 403 and is_detail(r)
    assert "sessions" in r.json()["detail"]
    for method, path, body in [("POST", "/create_session", None), ("POST", "/ping", None),
                               ("GET", "/math/prompt", None),
                               ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}}),
                               ("POST", "/delete", None), ("POST", "/delete_session", None)]:
        r = await client.request(method, path, headers=headers, json=body)
        assert r.status_code == 403 and is_detail(r), (path, r.text)
    assert (await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200
    assert await acalls(sid) == []
