"""Every route that decodes a client's JSON goes through orsplatform/bounded_json.py: 100,000 levels of
`[` (and an object or array just past the bound of 100, which orjson alone would take), NaN, Infinity,
-Infinity and a number too large for a double are a 4xx whose detail says which rule the body broke
(never a RecursionError's 500, never the Rollout API's misleading 409), nothing of the request is
written, and the route still serves a normal request afterwards. The REST API, the Rollout API, the
ORS and OpenEnv faces (OpenEnv answers FastAPI's 422 shape, MCP a JSON-RPC parse error), the
X-Secrets header and task rows; a route of another team's environment refuses first (no parse)."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field

import pytest
from asgiref.sync import sync_to_async

from orsplatform import bounded_json
from orsplatform.episodes.models import Session
from orsplatform.evals.models import Agent, EvalRun
from orsplatform.runs.models import Rollout, RolloutMessage
from tests.catalog.support import FILE_TASKS_ENV, in_thread, jsonl, publish, upload_tasks

DEEP = "nested too deeply"
NOT_FINITE = "Non-finite numbers are not accepted"
BAD_BODIES = {
    "100000 [": (b"[" * 100_000, DEEP),
    "101 closed arrays": (b"[" * 101 + b"]" * 101, DEEP),
    "101 nested objects": (b'{"a":' * 101 + b"1" + b"}" * 101, DEEP),
    "NaN": (b'{"split": "train", "index": NaN, "events": []}', NOT_FINITE),
    "Infinity": (b'{"split": "train", "index": Infinity}', NOT_FINITE),
    "-Infinity": (b'{"split": "train", "reward": -Infinity}', NOT_FINITE),
    "1e400": (b'{"split": "train", "sample_size": 1e400}', NOT_FINITE),
}
ENV = "/api/v1/environments/acme/quiz"


@dataclass
class Route:
    method: str
    path: str
    refused: int  # the status of a refused body
    normal: dict  # a request that is fine
    normal_status: int
    headers: dict = field(default_factory=dict)
    needs_env: bool = False  # acme/quiz, published for the test
    shape: str = "detail"  # how the reason is carried: "detail", "fastapi" (OpenEnv), "jsonrpc" (MCP)


def _rollout() -> dict:
    return {"events": [{"eventType": "rollout", "eventId": str(uuid.uuid4()), "timestamp": 1_790_000_000_000,
                        "runName": "bounded"}]}


ROUTES = {
    "POST /v1/rollouts": Route("POST", "/v1/rollouts", 400, _rollout(), 200),
    "PATCH splits/{split}": Route("PATCH", f"{ENV}/splits/train", 400, {"hidden_fields": []}, 200, needs_env=True),
    "POST rollback": Route("POST", f"{ENV}/rollback", 400, {"version": 1}, 200, needs_env=True),
    "PUT verify-settings": Route("PUT", f"{ENV}/verify-settings", 400, {"report_only": True}, 200, needs_env=True),
    "PUT /api/v1/retention": Route("PUT", "/api/v1/retention", 400, {"hot_days": 30}, 200),
    "POST /api/v1/agents": Route("POST", "/api/v1/agents", 400, {"name": "a"}, 400),
    "POST /api/v1/eval-runs": Route("POST", "/api/v1/eval-runs", 400, {"agent": 1}, 400),
    "POST eval-runs/{id}/resume": Route("POST", "/api/v1/eval-runs/1/resume", 400, {}, 404),
    "ORS create_session": Route("POST", "/create_session", 400, {}, 200),
    "ORS create": Route("POST", "/math/create", 400, {"split": "train", "index": 0}, 200,
                        headers={"X-Session-ID": "new"}),
    "ORS tasks": Route("POST", "/math/tasks", 400, {"split": "train"}, 200),
    "ORS task": Route("POST", "/math/task", 400, {"split": "train", "index": 0}, 200),
    "ORS task_range": Route("POST", "/math/task_range", 400, {"split": "train", "start": 0, "stop": 2}, 200),
    "ORS num_tasks": Route("POST", "/math/num_tasks", 400, {"split": "train"}, 200),
    "OpenEnv reset": Route("POST", "/openenv/builtin/math/reset", 422, {"split": "train", "index": 0}, 200,
                           shape="fastapi"),
    "OpenEnv step": Route("POST", "/openenv/builtin/math/step", 422, {"action": {"type": "list_tools"}}, 200,
                          shape="fastapi"),
    "OpenEnv tasks": Route("POST", "/openenv/builtin/math/tasks", 422, {"split": "train"}, 200, shape="fastapi"),
    "OpenEnv task": Route("POST", "/openenv/builtin/math/task", 422, {"split": "train", "index": 1}, 200,
                          shape="fastapi"),
    "OpenEnv task_range": Route("POST", "/openenv/builtin/math/task_range", 422, {"split": "train"}, 200,
                                shape="fastapi"),
    "OpenEnv num_tasks": Route("POST", "/openenv/builtin/math/num_tasks", 422, {"split": "train"}, 200,
                               shape="fastapi"),
    "OpenEnv mcp": Route("POST", "/openenv/builtin/math/mcp", 200, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         200, shape="jsonrpc"),
}


def _reason(route: Route, response) -> str:
    """The refusal's reason, where the route's documented shape carries it."""
    body = response.json()
    if route.shape == "fastapi":
        assert body["detail"][0]["type"] == "json_invalid", body
        return body["detail"][0]["ctx"]["error"]
    if route.shape == "jsonrpc":
        assert body["error"]["code"] == -32700, body
        return body["error"]["message"]
    assert set(body) == {"detail"} and isinstance(body["detail"], str), body
    return body["detail"]


def _written() -> tuple[int, ...]:
    return (Session.objects.count(), Rollout.objects.count(), RolloutMessage.objects.count(), Agent.objects.count(),
            EvalRun.objects.count())


async def _send(client, route: Route, person, *, content: bytes):
    headers = {**person.headers, "Content-Type": "application/json", **route.headers}
    if headers.get("X-Session-ID") == "new":
        headers["X-Session-ID"] = str(uuid.uuid4())
    return await client.request(route.method, route.path, headers=headers, content=content)


@pytest.mark.parametrize("name", list(ROUTES))
async def test_a_body_too_deep_or_not_finite_is_refused_with_its_reason_and_the_route_still_serves(
        client, owner, member, outsider, name):
    route = ROUTES[name]
    if route.needs_env:
        assert (await in_thread(publish)(owner, "quiz", "quiz.py", FILE_TASKS_ENV)).status_code == 201
    before = await sync_to_async(_written)()
    for label, (content, reason) in BAD_BODIES.items():
        r = await _send(client, route, owner, content=content)
        assert r.status_code == route.refused, (label, r.status_code, r.text[:300])
        text = _reason(route, r)
        assert reason in text, (label, text)
        if reason == DEEP:
            assert f"at most {bounded_json.MAX_DEPTH} levels" in text
        if route.needs_env:  # another team's environment, a key without the scope: refused before parsing
            assert (await _send(client, route, outsider, content=content)).status_code == 404
            assert (await _send(client, route, member, content=content)).status_code == 403
    assert await sync_to_async(_written)() == before  # nothing half-written
    assert (await client.get("/health")).status_code == 200
    r = await _send(client, route, owner, content=json.dumps(route.normal).encode())
    assert r.status_code == route.normal_status, r.text[:300]


async def test_the_x_secrets_header_is_bounded_too(client, owner):
    for label, (content, reason) in BAD_BODIES.items():
        if label == "100000 [":
            continue  # a header that long is the perimeter's 431 before any decoder
        headers = {**owner.headers, "X-Secrets": base64.b64encode(content).decode()}
        r = await client.post("/math/create", headers={**headers, "X-Session-ID": str(uuid.uuid4())},
                              json={"split": "train", "index": 0})
        assert r.status_code == 400 and reason in r.json()["detail"], r.text[:300]
    assert await sync_to_async(Session.objects.count)() == 0


def test_task_rows_too_deep_or_not_finite_are_refused_naming_the_line(owner):
    assert publish(owner, "quiz", "quiz.py", FILE_TASKS_ENV).status_code == 201
    rows = jsonl([{"question": "q0", "answer": "a"}]) + '{"question": NaN}\n' + ('{"q":' * 101 + "1" + "}" * 101) + "\n"
    r = upload_tasks(owner, "quiz", "train", "t.jsonl", rows)
    assert r.status_code == 400, r.content
    errors = {e["line"]: e["error"] for e in r.json()["errors"]}
    assert sorted(errors) == [2, 3] and NOT_FINITE in errors[2] and DEEP in errors[3], errors


@pytest.mark.parametrize("text, depth_ok", [("[" * 100 + "]" * 100, True), ("[" * 101 + "]" * 101, False),
                                            ('["' + "[" * 500 + '"]', True), ("{}", True), ("7", True)])
def test_the_bound_counts_levels_of_arrays_and_objects_not_brackets_in_strings(text, depth_ok):
    if depth_ok:
        bounded_json.loads(text.encode())
    else:
        with pytest.raises(bounded_json.JsonTooDeep):
            bounded_json.loads(text.encode())


def test_lone_surrogates_are_taken_only_where_the_reader_cleans_them():
    with pytest.raises(bounded_json.JsonRefused, match="Not valid JSON"):
        bounded_json.loads(b'"\\ud800"')
    assert bounded_json.loads(b'["\\ud800"]', lone_surrogates=True) == ["\ud800"]
    for content, _ in BAD_BODIES.values():
        with pytest.raises((bounded_json.JsonTooDeep, bounded_json.JsonNotFinite)):
            bounded_json.loads(b'["\\ud800", ' + content + b"]", lone_surrogates=True)
