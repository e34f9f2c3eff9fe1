"""An uploaded package is served end to end over ORS: in process, and with the official client against
a real server. Rollback moves discovery back; ``@N`` and ``X-Deployment`` pin a version."""

from __future__ import annotations

from ors.client import ORS

from orsplatform.episodes.models import Session
from tests.catalog.support import api, echo_env, in_thread, publish, zip_bytes
from tests.fixtures.ors import sse_result, start_episode


async def call(client, headers: dict, sid: str, name: str, body: dict) -> dict:
    r = await client.post("/call", headers={**headers, "X-Session-ID": sid}, json={"name": name, "input": body})
    return sse_result(r.text)


async def test_a_package_uploaded_through_the_api_runs_an_episode(client, owner):
    r = await in_thread(publish)(owner, "echo", "echo.zip", zip_bytes({"env.py": echo_env("one")}))
    assert r.status_code == 201, r.json()
    headers = owner.headers
    tools = await client.get("/acme/echo/tools", headers=headers)
    assert [t["name"] for t in tools.json()["tools"]] == ["say"]
    task = (await client.post("/acme/echo/task", headers=headers, json={"split": "train", "index": 1})).json()["task"]
    assert task == {"id": "train-1", "word": "trainword1"}
    sid = await start_episode(client, headers, env="acme/echo", split="train", index=1)
    prompt = await client.get("/acme/echo/prompt", headers={**headers, "X-Session-ID": sid})
    assert prompt.json()[0]["text"] == "Say trainword1 (one)"
    result = await call(client, headers, sid, "say", {"word": "trainword1"})
    assert result["ok"] is True and result["output"]["reward"] == 1.0 and result["output"]["finished"] is True
    session = await in_thread(Session.objects.select_related("version").get)(sid=sid)
    assert session.version.number == 1


async def test_rollback_moves_discovery_back_and_pinning_still_serves_each_version(client, owner, settings):
    settings.ORS_CATALOG_CACHE_SECONDS = 0
    headers = owner.headers
    await in_thread(publish)(owner, "echo", "echo.py", echo_env("one"))
    await in_thread(publish)(owner, "echo", "echo.py", echo_env("two", extra_tool="shout"))

    async def tool_names(path: str, **extra) -> list[str]:
        r = await client.get(path, headers={**headers, **extra})
        assert r.status_code == 200, r.text
        return [t["name"] for t in r.json()["tools"]]

    assert await tool_names("/acme/echo/tools") == ["say", "shout"]
    rollback = await in_thread(lambda: api(owner).post(
        "/api/v1/environments/acme/echo/rollback", {"version": 1}, content_type="application/json"))()
    assert rollback.status_code == 200
    assert await tool_names("/acme/echo/tools") == ["say"]
    assert await tool_names("/acme/echo@2/tools") == ["say", "shout"]
    assert await tool_names("/tools", **{"X-Deployment": "acme/echo@2"}) == ["say", "shout"]
    assert await tool_names("/tools", **{"X-Deployment": "acme/echo"}) == ["say"]

    # A session on the pinned version runs that version's code and records it.
    sid = await start_episode(client, headers, env="acme/echo@2", split="test", index=0)
    prompt = await client.get("/prompt", headers={**headers, "X-Session-ID": sid})
    assert prompt.json()[0]["text"] == "Say testword0 (two)"
    session = await in_thread(Session.objects.select_related("version").get)(sid=sid)
    assert session.version.number == 2
    current = await start_episode(client, headers, env="acme/echo", split="test", index=0)
    prompt = await client.get("/prompt", headers={**headers, "X-Session-ID": current})
    assert prompt.json()[0]["text"] == "Say testword0 (one)"


async def test_another_team_cannot_run_a_private_uploaded_environment(client, owner, outsider):
    await in_thread(publish)(owner, "echo", "echo.py", echo_env("one"))
    r = await client.get("/acme/echo/tools", headers=outsider.headers)
    assert r.status_code == 404


def test_the_official_client_runs_an_uploaded_environment_on_a_real_server(server_factory, owner):
    r = publish(owner, "echo", "echo.py", echo_env("one"), visibility="private")
    assert r.status_code == 201, r.json()
    server = server_factory()
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("acme/echo")
        assert env.list_splits() == ["train", "test"]
        assert env.num_tasks("train") == 3
        task = env.get_task("train", 2)
        assert task.task_spec["word"] == "trainword2"
        assert [t.name for t in env.list_tools()] == ["say"]
        with env.session(task=task) as session:
            assert session.get_prompt()[0].text == "Say trainword2 (one)"
            out = session.call_tool("say", {"word": "trainword2"})
            assert out.reward == 1.0 and out.finished is True
        pinned = client.environment("acme/echo@1")
        assert pinned.num_tasks("test") == 3
