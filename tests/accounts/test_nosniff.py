"""X-Content-Type-Options: nosniff on every API response: the REST API (Django's SecurityMiddleware), the
ORS face's JSON and SSE, and the OpenEnv face's JSON, errors included, on a real server."""

from __future__ import annotations

import httpx

NOSNIFF = "nosniff"


def test_the_rest_api_answers_nosniff(server, owner):
    for response in (httpx.get(f"{server.url}/api/v1/environments", headers=owner.headers, timeout=30),
                     httpx.get(f"{server.url}/api/v1/sessions/nope", headers=owner.headers, timeout=30),
                     httpx.get(f"{server.url}/api/v1/environments", timeout=30)):
        assert response.headers.get("x-content-type-options") == NOSNIFF, (response.status_code, response.headers)


def test_the_ors_face_answers_nosniff_on_json_errors_and_sse(server, owner):
    url = server.url
    responses = [
        httpx.get(f"{url}/health", timeout=30),
        httpx.get(f"{url}/list_environments", timeout=30),
        httpx.get(f"{url}/no/such/thing/here", timeout=30),  # 404 from the face
        httpx.post(f"{url}/create_session", timeout=30),  # 401 without a key
    ]
    sid = httpx.post(f"{url}/create_session", headers=owner.headers, timeout=30).json()["sid"]
    headers = {**owner.headers, "X-Session-ID": sid}
    created = httpx.post(f"{url}/create", headers=headers, json={"env_name": "math", "split": "train", "index": 0},
                         timeout=60)
    assert created.status_code == 200, created.text
    responses.append(created)
    with httpx.stream("POST", f"{url}/math/call", headers={**headers, "Accept": "text/event-stream"},
                      json={"name": "submit", "input": {"answer": "0"}}, timeout=60) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers.get("x-content-type-options") == NOSNIFF
        stream.read()
    for response in responses:
        assert response.headers.get("x-content-type-options") == NOSNIFF, (response.request.url, response.status_code)


def test_the_openenv_face_answers_nosniff(server, owner):
    url = f"{server.url}/openenv"
    for response in (httpx.get(f"{url}/builtin/math/health", timeout=30),
                     httpx.get(f"{url}/builtin/math/metadata", headers=owner.headers, timeout=30),
                     httpx.post(f"{url}/builtin/math/step", headers=owner.headers, content=b"{not json",
                                timeout=30),
                     httpx.get(f"{url}/builtin/nope/health", timeout=30)):
        assert response.headers.get("x-content-type-options") == NOSNIFF, (response.request.url, response.status_code)
