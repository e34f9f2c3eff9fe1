from tests.fixtures.ors import parse_sse, sse_result, start_episode

async def test_nul(client, owner):
    h = owner.headers
    for path, body in [("/math%00/tools", None), ("/create", {"env_name": "ma\u0000th", "split": "train", "index": 0}),
                       ("/math/create", {"task_spec": {"question": "a\u0000b", "answer": "1"}})]:
        r = await client.post(path, headers={**h, "X-Session-ID": "s-" + str(len(path))}, json=body) if body else await client.get(path, headers=h)
        print(path, r.status_code, r.text)
    sid = await start_episode(client, h)
    r = await client.post("/math/call", headers={**h, "X-Session-ID": sid}, json={"name": "submit", "input": {"answer": "1\u0000"}})
    print(r.status_code, r.text)
    r = await client.post("/math/call", headers={**h, "X-Session-ID": sid}, json={"task_id": "ab\u0000"})
    print(r.status_code, r.text)
    r = await client.post("/math/task", headers=h, json={"split": "train", "index": 2**70})
    print(r.status_code, r.text)
    r = await client.post("/math/task_range", headers=h, json={"split": "train", "start": 2**70, "stop": -2**70})
    print(r.status_code, r.text)
    r = await client.post("/math/task", headers=h, content=b'{"split": "train", "index": 1e400}')
    print(r.status_code, r.text)
    r = await client.post("/math/tasks", headers={**h, "X-Deployment": "builtin/ma\u00e9th".encode("utf-8")}, json={"split": "train"})
    print(r.status_code, r.text)
