from tests.fixtures.ors import sse_result, start_episode


async def test_a_full_episode_runs_in_process(client, owner):
    sid = await start_episode(client, owner.headers, split="train", index=3)
    task = (await client.post("/math/task", headers=owner.headers, json={"split": "train", "index": 3})).json()["task"]
    prompt = await client.get("/math/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert prompt.status_code == 200
    assert task["question"] in prompt.json()[0]["text"]
    r = await client.post("/math/call", headers={**owner.headers, "X-Session-ID": sid},
                          json={"name": "submit", "input": {"answer": task["answer"]}})
    assert r.headers["content-type"] == "text/event-stream"
    result = sse_result(r.text)
    assert result["ok"] is True and result["output"]["reward"] == 1.0 and result["output"]["finished"] is True
    r = await client.post("/delete", headers={**owner.headers, "X-Session-ID": sid})
    assert r.json() == {"sid": sid}
    r = await client.post("/ping", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 410


async def test_a_websocket_handshake_on_an_ors_path_is_refused_not_a_500(ors_app):
    from orsplatform.asgi import build_application

    app = build_application(ors_app)
    sent: list[dict] = []
    messages = iter([{"type": "websocket.connect"}])

    async def receive() -> dict:
        return next(messages)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/math/call", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
