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
