"""Malformed requests of every kind: each answer is a 4xx with a JSON {"detail": str} (never a
5xx), nothing is half-written, and afterwards the same gateway still serves a normal episode."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from tests.fixtures.ors import parse_sse, sse_result, start_episode
from tests.ors.support import acalls, acount, arow

POST_ENDPOINTS = ["tasks", "num_tasks", "task", "task_range", "create_session", "create", "ping", "delete",
                  "delete_session", "call"]
# Endpoints that read a JSON body (the others only look at X-Session-ID).
BODY_ENDPOINTS = ["tasks", "num_tasks", "task", "task_range", "create_session", "create", "call"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Gateway:
    """One gateway, one open session, and a list of what answered wrongly."""

    def __init__(self, client, person, sid: str) -> None:
        self.client = client
        self.person = person
        self.sid = sid
        self.problems: list[str] = []

    def path_and_headers(self, endpoint: str, headers: dict | None) -> tuple[str, dict]:
        h = dict(self.person.headers)
        if endpoint == "create":
            h["X-Session-ID"] = str(uuid.uuid4())
        elif endpoint in ("ping", "call"):
            h["X-Session-ID"] = self.sid
        elif endpoint in ("delete", "delete_session"):
            h["X-Session-ID"] = str(uuid.uuid4())  # never end the shared session
        h.update(headers or {})
        named = ("tasks", "num_tasks", "task", "task_range", "call", "create")
        path = f"/math/{endpoint}" if endpoint in named else f"/{endpoint}"
        return path, h

    async def send(self, label: str, method: str, path: str, headers: dict, *, json_body=None, content=None,
                   want: int | tuple[int, ...] | None = None):
        kwargs = {"json": json_body} if content is None else {"content": content}
        if content is not None and "Content-Type" not in headers:
            headers = {**headers, "Content-Type": "application/json"}
        r = await self.client.request(method, path, headers=headers, **kwargs)
        self.check(label, r, want)
        return r

    def check(self, label: str, r, want: int | tuple[int, ...] | None) -> None:
        allowed = (want,) if isinstance(want, int) else want
        if r.status_code >= 500:
            self.problems.append(f"{label}: {r.status_code} {r.text[:300]}")
            return
        if allowed is not None and r.status_code not in allowed:
            self.problems.append(f"{label}: {r.status_code}, want {allowed}: {r.text[:300]}")
            return
        if r.status_code >= 400 and r.request.method != "HEAD":
            try:
                body = r.json()
            except ValueError:
                body = None
            if (r.headers.get("content-type") != "application/json" or not isinstance(body, dict)
                    or set(body) != {"detail"} or not isinstance(body["detail"], str) or not body["detail"]):
                self.problems.append(f"{label}: {r.status_code} without a JSON detail: {r.text[:300]}")

    async def post(self, endpoint: str, label: str, *, json_body=None, content=None, headers=None, want=400):
        path, h = self.path_and_headers(endpoint, headers)
        if endpoint == "create" and isinstance(json_body, dict) and "env_name" in json_body:
            path = "/create"  # the body names the environment (the path would win over it)
        return await self.send(f"{endpoint} {label}", "POST", path, h, json_body=json_body, content=content,
                               want=want)

    async def still_serves_an_episode(self) -> None:
        """The same gateway runs a whole episode; the shared session still works too."""
        h = self.person.headers
        task = (await self.client.post("/math/task", headers=h, json={"split": "test", "index": 11})).json()["task"]
        sid = await start_episode(self.client, h, split="test", index=11)
        sh = {**h, "X-Session-ID": sid}
        r = await self.client.get("/math/prompt", headers=sh)
        assert r.status_code == 200 and task["question"] in r.json()[0]["text"]
        r = await self.client.post("/math/call", headers=sh, json={"name": "submit", "input": {"answer": task["answer"]}})
        assert sse_result(r.text)["output"]["reward"] == 1.0
        assert (await self.client.post("/delete", headers=sh)).json() == {"sid": sid}
        assert (await self.client.post("/ping", headers={**h, "X-Session-ID": self.sid})).status_code == 200

    def assert_ok(self) -> None:
        assert not self.problems, "\n".join(self.problems)


@pytest.fixture
async def gw(client, owner) -> Gateway:
    sid = await start_episode(client, owner.headers, split="test", index=0)
    return Gateway(client, owner, sid)


BAD_BODIES = {
    "not-json": b"{not json",
    "truncated": b'{"split": "test"',
    "array": b'["split", "test"]',
    "string": b'"split"',
    "number": b"42",
    "null": b"null",
    "true": b"true",
    "invalid-utf8": b'{"split": "\xff\xfe"}',
    "nul-byte": b"\x00",
    "deep-nesting": b"[" * 100_000,
    "deep-object": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "trailing-garbage": b'{"split": "test"} xyz',
    "nan": b'{"split": "test", "index": NaN}',
    "huge-exponent": b'{"split": "test", "index": 1e400}',
}


async def test_a_body_that_is_not_a_json_object_answers_400(gw):
    for endpoint in BODY_ENDPOINTS:
        for label, content in BAD_BODIES.items():
            await gw.post(endpoint, label, content=content, want=400)
    # Endpoints that only look at X-Session-ID ignore the body, but never fail on it.
    for endpoint in ("ping", "delete", "delete_session"):
        for label, content in BAD_BODIES.items():
            await gw.post(endpoint, label, content=content, want=(200, 404))
    gw.assert_ok()
    await gw.still_serves_an_episode()


async def test_an_empty_body_answers_400_where_fields_are_required(gw):
    for endpoint in ("tasks", "num_tasks", "task", "task_range", "create", "call"):
        await gw.post(endpoint, "empty", content=b"", want=400)
    await gw.post("create_session", "empty", content=b"", want=200)
    gw.assert_ok()
    await gw.still_serves_an_episode()


WRONG_TYPES = {
    "tasks": [{"split": 3}, {"split": None}, {"split": ["test"]}, {"split": {"name": "test"}}, {"split": True}, {}],
    "num_tasks": [{"split": 3}, {"split": None}, {"split": ["test"]}, {"split": 1.5}, {}],
    "task": [{"split": 3, "index": 0}, {"split": "test", "index": "3"}, {"split": "test", "index": True},
             {"split": "test", "index": False}, {"split": "test", "index": 1.5}, {"split": "test", "index": 1.0},
             {"split": "test", "index": None}, {"split": "test", "index": [0]}, {"split": "test", "index": {}},
             {"split": "test"}, {"index": 0}, {"split": "test", "index": 2**64}, {"split": "test", "index": -2**64}],
    "task_range": [{"split": 3}, {"split": "test", "start": "0"}, {"split": "test", "stop": True},
                   {"split": "test", "start": 1.5}, {"split": "test", "stop": [1]}, {"split": "test", "start": {}},
                   {"start": 0, "stop": 2}],
    "create": [{"split": 3, "index": 0}, {"split": "test", "index": "3"}, {"split": "test", "index": True},
               {"split": "test", "index": 1.5}, {"split": "test", "index": [0]},
               {"task_spec": "What is 2+2?"}, {"task_spec": ["q"]}, {"task_spec": 5}, {"task_spec": True},
               {"split": "test", "index": 0, "secrets": ["a", "b"]}, {"split": "test", "index": 0, "secrets": "x"},
               {"split": "test", "index": 0, "secrets": {"a": 1}},
               {"split": "test", "index": 0, "secrets": {"a": None}},
               {"split": "test", "index": 0, "secrets": {"a": {"value": 1}}},
               {"split": "test", "index": 0, "secrets": {"a": {"allowed_domains": []}}},
               {"split": "test", "index": 0, "secrets": {"a": ["v"]}},
               {"split": "test", "index": 0, "env_name": 5}, {"split": "test", "index": 0, "env_name": ["math"]},
               {"split": "test", "index": 0, "toolset_name": 5},
               {"split": "nosuch", "index": 0}, {"split": "test", "index": 1000}, {"split": "test", "index": -1},
               {"split": "test", "index": 2**64}],
    "create_session": [{"env": ["A"]}, {"env": "A=b"}, {"env": {"A": 1}}, {"env": {"A": None}}, {"env": {"A": ["b"]}}],
    "call": [{"name": "submit", "input": ["4"]}, {"name": "submit", "input": "4"}, {"name": "submit", "input": 4},
             {"name": "submit", "input": None}, {"input": {"answer": "4"}}, {"name": 5, "input": {}},
             {"name": None, "input": {}}, {"name": ["submit"], "input": {}}, {"name": {"x": 1}, "input": {}},
             {"task_id": 5}, {"task_id": ["x"]}, {"task_id": {"x": 1}}, {"task_id": True}],
}


async def test_fields_of_the_wrong_type_answer_400(gw, ors_app):
    sessions_before = set(ors_app.gateway.sessions)
    rows_before = await acount()
    for endpoint, bodies in WRONG_TYPES.items():
        for body in bodies:
            await gw.post(endpoint, json.dumps(body)[:80], json_body=body, want=400)
    gw.assert_ok()
    # None of the rejected /create calls left anything behind, and no call was made.
    assert set(ors_app.gateway.sessions) == sessions_before
    assert await acount() == rows_before
    assert await acalls(gw.sid) == []
    await gw.still_serves_an_episode()


BAD_X_SECRETS = {
    "not-base64": "not base64!!",
    "bad-padding": "abc",
    "not-json": b64(b"not json"),
    "not-utf8": b64(b"\xff\xfe\xfd"),
    "list": b64(b'["a", "b"]'),
    "string": b64(b'"secret"'),
    "number-value": b64(b'{"a": 1}'),
    "value-not-string": b64(b'{"a": {"value": 1}}'),
    "no-value": b64(b'{"a": {"allowed_domains": ["x"]}}'),
    "null": b64(b"null"),
    "unicode-in-header": "\u00e9\u00e9\u00e9",
}


async def test_a_malformed_x_secrets_header_answers_400(gw, ors_app):
    rows_before = await acount()
    for label, value in BAD_X_SECRETS.items():
        headers = {"X-Secrets": value.encode("utf-8")}
        await gw.post("create", f"X-Secrets {label}", json_body={"split": "test", "index": 0}, headers=headers)
        await gw.post("create_session", f"X-Secrets {label}", json_body={}, headers=headers)
    gw.assert_ok()
    assert await acount() == rows_before
    await gw.still_serves_an_episode()


async def test_an_x_secrets_header_does_not_echo_the_secret_in_its_error(gw):
    value = f"canary-{uuid.uuid4().hex}"
    for raw in (json.dumps({"k": {"value": 5, "v2": value}}), json.dumps({"k": [value]}), json.dumps([value])):
        r = await gw.post("create", "echo", json_body={"split": "test", "index": 0},
                          headers={"X-Secrets": b64(raw.encode())})
        assert value not in r.text
        r = await gw.post("create", "echo-body", json_body={"split": "test", "index": 0, "secrets": json.loads(raw)})
        assert value not in r.text
    gw.assert_ok()


BAD_SIDS = {
    "too-long": "x" * 129,
    "space": "a b",
    "slash": "a/b",
    "non-ascii": "s\u00fcd".encode(),
    "tab": "a\tb",
    "angle": "<script>",
    "quote": "a'b",
    "semicolon": "a;b",
    "percent": "a%20b",
    "empty": "",
    "blank": "   ",
    "nul": "a\x00b",
    "very-long": "y" * 5000,
}
SESSION_CALLS = [
    ("POST", "/math/create", {"split": "test", "index": 0}),
    ("POST", "/ping", None),
    ("POST", "/delete", None),
    ("POST", "/delete_session", None),
    ("GET", "/math/prompt", None),
    ("GET", "/math/task_tools", None),
    ("POST", "/math/call", {"name": "submit", "input": {"answer": "1"}}),
    ("POST", "/math/call", {"task_id": "abc"}),
]


async def test_an_overlong_or_illegal_session_id_answers_400(gw, ors_app):
    rows_before = await acount()
    for label, sid in BAD_SIDS.items():
        for method, path, body in SESSION_CALLS:
            headers = {**gw.person.headers, "X-Session-ID": sid}
            await gw.send(f"{method} {path} sid={label}", method, path, headers, json_body=body, want=400)
    gw.assert_ok()
    assert await acount() == rows_before
    # The longest legal id works.
    sid = "x" * 128
    r = await gw.client.post("/math/create", headers={**gw.person.headers, "X-Session-ID": sid},
                             json={"split": "test", "index": 0})
    assert r.status_code == 200, r.text
    assert (await gw.client.post("/ping", headers={**gw.person.headers, "X-Session-ID": sid})).status_code == 200
    await gw.still_serves_an_episode()


async def test_a_body_over_the_size_limit_answers_413(gw, settings):
    settings.ORS_MAX_BODY_BYTES = 1000
    big = {"split": "test", "index": 0, "padding": "x" * 2000}
    for endpoint in POST_ENDPOINTS:
        await gw.post(endpoint, "huge", json_body=big, want=413)

    # Without a Content-Length (a streamed body) the limit holds too.
    async def stream():
        for _ in range(10):
            yield b"x" * 200

    for endpoint in POST_ENDPOINTS:
        path, h = gw.path_and_headers(endpoint, None)
        await gw.send(f"{endpoint} streamed", "POST", path, h, content=stream(), want=413)
    # A lying Content-Length.
    path, h = gw.path_and_headers("task", {"Content-Length": "not-a-number"})
    await gw.send("task bad content-length", "POST", path, h, content=b'{"split": "test", "index": 0}', want=400)
    gw.assert_ok()
    # Just under the limit is fine.
    body = {"split": "test", "index": 0}
    body["pad"] = "x" * (1000 - len(json.dumps(body)) - 12)
    assert len(json.dumps(body)) <= 1000
    r = await gw.client.post("/math/task", headers=gw.person.headers, json=body)
    assert r.status_code == 200, r.text
    await gw.still_serves_an_episode()


async def test_headers_over_the_size_limit_answer_a_4xx(gw):
    for endpoint in ("task", "create", "call"):
        await gw.post(endpoint, "huge header", json_body={"split": "test", "index": 0},
                      headers={"X-Padding": "p" * 20_000}, want=431)
    r = await gw.client.get("/health", headers={"X-Padding": "p" * 20_000})
    gw.check("health huge header", r, 431)
    gw.assert_ok()
    await gw.still_serves_an_episode()


UNKNOWN_PATHS = [
    ("GET", "/nope"), ("POST", "/nope"), ("GET", "/math/nope"), ("POST", "/math/nope"),
    ("GET", "/math/tools/extra"), ("GET", "/a/b/c/tools"), ("GET", "/a/b/c/d/tools"),
    ("POST", "/builtin/math/extra/task"), ("POST", "/a/b/c/d/create"), ("POST", "/a/b/c/d/e/ping"),
    ("GET", "/math//tools"), ("GET", "/builtin//tools"), ("GET", "/@1/tools"), ("GET", "/builtin/math@1@2/tools"),
    ("GET", "/builtin/math@-1/tools"), ("GET", "/builtin/math@99999999999/tools"), ("GET", "/..%2F..%2Fetc/tools"),
    ("GET", "/m%C3%A4th/tools"), ("GET", "/" + "a" * 5000 + "/tools"),
    ("GET", "/health/"), ("GET", "/tools/tools/tools/tools"), ("GET", "/math/TOOLS"), ("GET", "/Math/tools"),
]


async def test_unknown_paths_answer_404(gw):
    for method, path in UNKNOWN_PATHS:
        body = {"split": "test", "index": 0} if method == "POST" else None
        want = 404 if path != "/health/" else (200, 404)
        await gw.send(f"{method} {path[:60]}", method, path, gw.person.headers, json_body=body, want=want)
    gw.assert_ok()
    await gw.still_serves_an_episode()


WRONG_METHODS = [
    ("GET", "/create"), ("GET", "/create_session"), ("GET", "/ping"), ("GET", "/delete"), ("GET", "/delete_session"),
    ("GET", "/math/call"), ("GET", "/math/tasks"), ("GET", "/math/task"), ("GET", "/math/num_tasks"),
    ("GET", "/math/task_range"), ("POST", "/health"), ("POST", "/version"), ("POST", "/list_environments"),
    ("POST", "/math/tools"), ("POST", "/math/splits"), ("POST", "/math/prompt"), ("POST", "/math/task_tools"),
    ("PUT", "/ping"), ("DELETE", "/delete"), ("PATCH", "/math/task"), ("OPTIONS", "/math/call"),
    ("HEAD", "/create"), ("PUT", "/math/tools"),
]


async def test_a_wrong_method_answers_405(gw):
    for method, path in WRONG_METHODS:
        headers = {**gw.person.headers, "X-Session-ID": gw.sid}
        r = await gw.send(f"{method} {path}", method, path, headers, want=405)
        if method != "HEAD" and r.status_code == 405 and "allow" not in r.headers:
            gw.problems.append(f"{method} {path}: 405 without Allow")
    gw.assert_ok()
    await gw.still_serves_an_episode()


async def test_head_on_a_get_endpoint_is_allowed(client):
    r = await client.head("/health")
    assert r.status_code == 200


async def test_a_garbage_deployment_header_answers_404(gw):
    for value in ("", " ", "a/b/c", "@", "/", "builtin/", "/math", "builtin/math@x", "x" * 5000, "\u00e9t\u00e9"):
        for method, path, body in [("GET", "/splits", None), ("POST", "/task", {"split": "test", "index": 0}),
                                   ("POST", "/create", {"split": "test", "index": 0})]:
            headers = {**gw.person.headers, "X-Deployment": value.encode("utf-8"), "X-Session-ID": str(uuid.uuid4())}
            want = (200, 404) if not value.strip() else 404
            await gw.send(f"{method} {path} X-Deployment={value[:20]!r}", method, path, headers, json_body=body,
                          want=want)
    gw.assert_ok()
    await gw.still_serves_an_episode()


# --- NUL characters (PostgreSQL text and jsonb cannot hold them) --------------------------------


async def test_nul_characters_in_names_and_payloads_never_answer_5xx(gw, ors_app):
    h = gw.person.headers
    await gw.send("path env with NUL", "GET", "/math%00/tools", h, want=404)
    await gw.send("path team/env with NUL", "POST", "/builtin/ma%00th/task", h,
                  json_body={"split": "test", "index": 0}, want=404)
    await gw.send("X-Deployment with NUL", "GET", "/splits", {**h, "X-Deployment": "builtin/ma\x00th"}, want=404)
    await gw.post("create", "env_name with NUL", json_body={"env_name": "ma\u0000th", "split": "test", "index": 0},
                  want=404)
    await gw.post("task", "split with NUL", json_body={"split": "te\u0000st", "index": 0}, want=400)
    await gw.post("create", "split with NUL", json_body={"split": "te\u0000st", "index": 0}, want=400)
    # A task_spec holding a NUL character is either refused (400) or stored and served.
    sid = str(uuid.uuid4())
    r = await gw.post("create", "task_spec with NUL", json_body={"task_spec": {"question": "a\u0000b", "answer": "1"}},
                      headers={"X-Session-ID": sid}, want=(200, 400))
    if r.status_code == 200:
        assert (await gw.client.get("/math/prompt", headers={**h, "X-Session-ID": sid})).status_code == 200
    # Reconnecting with a task_id holding a NUL character: it is simply unknown.
    r = await gw.client.post("/math/call", headers={**h, "X-Session-ID": gw.sid}, json={"task_id": "ab\u0000cd"})
    if r.status_code == 200:
        if parse_sse(r.text) != [("error", "unknown task_id")]:
            gw.problems.append(f"task_id with NUL: {r.text}")
    else:
        gw.check("task_id with NUL", r, 400)
    gw.assert_ok()
    await gw.still_serves_an_episode()


async def test_a_call_whose_input_holds_a_nul_character_is_still_audited(client, owner):
    sid = await start_episode(client, owner.headers, split="test", index=0)
    r = await client.post("/math/call", headers={**owner.headers, "X-Session-ID": sid},
                          json={"name": "submit", "input": {"answer": "4\u00002"}})
    assert r.status_code == 200
    task_id = parse_sse(r.text)[0][1]
    result = sse_result(r.text)
    rows = await acalls(sid)
    assert [row["task_id"] for row in rows] == [task_id], "the call is missing from the audit log"
    assert rows[0]["output"]["ok"] == result["ok"]


# --- nothing half-written -----------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    {"split": "nosuch", "index": 0},
    {"split": "test", "index": 1000},
    {"split": "test", "index": -1},
    {"split": "test", "index": 0, "secrets": ["x"]},
    {"split": "test", "index": 0, "env_name": "nosuchenv"},
    {"task_spec": "x"},
    {"task_spec": {"q": 1}, "split": "test", "index": 0},
], ids=["bad-split", "index-too-big", "negative-index", "bad-secrets", "unknown-env", "spec-not-object", "both"])
async def test_a_rejected_create_leaves_nothing_behind(client, owner, ors_app, body):
    sid = str(uuid.uuid4())
    headers = {**owner.headers, "X-Session-ID": sid}
    path = "/create" if "env_name" in body else "/math/create"
    r = await client.post(path, headers=headers, json=body)
    assert 400 <= r.status_code < 500
    assert set(r.json()) == {"detail"}
    assert await arow(sid) is None
    assert sid not in ors_app.gateway.sessions
    assert (await client.post("/ping", headers=headers)).status_code == 404
    # The id is still free: a valid /create with it succeeds.
    r = await client.post("/math/create", headers=headers, json={"split": "test", "index": 0})
    assert r.status_code == 200, r.text
    assert (await arow(sid))["task_index"] == 0
    assert (await client.get("/math/prompt", headers=headers)).status_code == 200


async def test_a_rejected_create_keeps_the_secrets_sent_with_create_session(client, owner):
    r = await client.post("/create_session", headers={
        **owner.headers, "X-Secrets": b64(json.dumps({"canary": {"value": "v"}}).encode())})
    sid = r.json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid}
    assert (await client.post("/math/create", headers=headers, json={"split": "nosuch", "index": 0})).status_code == 400
    assert (await client.post("/math/create", headers=headers, json={"split": "test", "index": 0})).status_code == 200
    r = await client.post("/math/call", headers=headers, json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["output"]["metadata"]["secrets_seen"] == ["canary"]


async def test_concurrent_creates_of_one_sid_make_exactly_one_session(client, owner, ors_app):
    import asyncio

    sid = str(uuid.uuid4())
    headers = {**owner.headers, "X-Session-ID": sid}
    answers = await asyncio.gather(*(client.post("/math/create", headers=headers, json={"split": "test", "index": i})
                                     for i in range(5)))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 400, 400, 400, 400], [r.text for r in answers]
    assert all("Session already exists" in r.json()["detail"] for r in answers if r.status_code == 400)
    assert await acount(sid=sid) == 1
    row = await arow(sid)
    winner = next(i for i, r in enumerate(answers) if r.status_code == 200)
    assert row["task_index"] == winner
    assert (await client.post("/ping", headers=headers)).status_code == 200
