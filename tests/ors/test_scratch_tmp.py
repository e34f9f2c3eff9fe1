from tests.fixtures.ors import parse_sse, sse_result, start_episode

async def test_v(client, owner):
    h = owner.headers
    r = await client.get("/vision/tools", headers=h); print([t["name"] for t in r.json()["tools"]])
    r = await client.post("/vision/task_range", headers=h, json={"split": "train", "stop": 6}); print(r.json())
    sid = await start_episode(client, h, env="vision", split="train", index=0)
    r = await client.get("/vision/task_tools", headers={**h, "X-Session-ID": sid}); print([t["name"] for t in r.json()["tools"]])
    r = await client.get("/list_environments", headers=h); print(r.json())
    r = await client.get("/list_environments"); print(r.json())
    r = await client.head("/health"); print(r.status_code, r.headers, r.content)
    r = await client.post("/math/task_range", headers=h, json={"split": "test", "start": -3}); print(r.json())
