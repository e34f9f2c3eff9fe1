"""What a TRL trainer meets over OpenEnv, with the unmodified ``openenv`` client against a real server:
``task_index`` (the column TRL forwards to ``reset(**row)``) picks the task, ``done`` stays true after
the episode finished (a ``while not done`` loop ends), and errors name their fix on the socket, over
HTTP (4xx with a detail) and over MCP."""

from __future__ import annotations

import httpx
from openenv.core.generic_client import GenericEnvClient

from tests.openenv.conftest import base_url


def client(server, env: str, headers: dict[str, str]):
    return GenericEnvClient(base_url=base_url(server, env), headers=headers).sync()


def call(name: str, **arguments) -> dict:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def test_a_dataset_row_with_task_index_plays_that_task_and_done_stays_true(server, owner):
    row = {"prompt": [{"role": "user", "content": "Solve it."}], "task_index": 7}
    with client(server, "builtin/math", owner.headers) as env:
        start = env.reset(split="test", **row)  # what an environment_factory's reset(**row) forwards
        meta = start.observation["metadata"]
        assert (meta["split"], meta["index"]) == ("test", 7) and env.state()["index"] == 7
        assert env.reset(split="test", index=4, task_index=4).observation["metadata"]["index"] == 4

        # A trainer's loop: it ends, and every call after the end keeps saying done.
        steps, done, result = 0, False, None
        while not done and steps < 5:
            result = env.step(call("submit", answer="-1"))
            done, steps = result.done, steps + 1
        assert steps == 1 and result.reward == 0.0
        for _ in range(2):
            after = env.step(call("submit", answer="-1"))
            assert after.done is True and after.reward is None
            assert after.observation["error"]["message"].startswith("The episode has already finished")


def test_reset_errors_on_the_socket_name_the_fix(server, owner):
    with client(server, "builtin/math", owner.headers) as env:
        for data, words in (
                ({"split": "tset", "index": 0}, "Invalid split 'tset'; the splits of builtin/math are: train, test."),
                ({"split": "test", "task_index": 10**6}, "Invalid index 1000000: split 'test' has"),
                ({"split": "test"}, "split and index (or task_index) must be provided together; the splits are: "
                                    "train, test.")):
            try:
                env.reset(**data)
            except Exception as exc:  # the client raises the error frame's message
                assert words in str(exc), (data, exc)
            else:
                raise AssertionError(f"reset({data}) was accepted")
        start = env.reset(split="test", index=1)
        assert start.observation["metadata"]["index"] == 1  # the socket still serves
        unknown = env.step(call("sumbit", answer="1"))
        assert unknown.observation["error"]["message"] == (
            "'sumbit' is not a valid tool; the tools are: submit. Did you mean 'submit'?")
        bad = env.step(call("submit"))
        assert bad.observation["error"]["message"] == "Invalid arguments for tool 'submit': answer: Field required."
        assert bad.done is False


def test_http_and_mcp_answer_the_same_words_as_4xx_details_and_rpc_errors(server, owner, outsider):
    with httpx.Client(base_url=f"{server.url}/openenv", headers=owner.headers, timeout=30) as http:
        r = http.post("/builtin/math/reset", json={"split": "test", "task_index": 9})
        assert r.status_code == 200 and r.json()["observation"]["metadata"]["index"] == 9
        r = http.post("/builtin/math/reset", json={"split": "test", "index": 1, "task_index": 2})
        assert r.status_code == 422 and "name different tasks" in r.json()["detail"][0]["msg"]
        r = http.post("/builtin/math/task", json={"split": "test", "index": 10**6})
        assert r.status_code == 400 and r.json()["detail"].startswith("Invalid index 1000000: split 'test' has")
        r = http.post("/builtin/math/num_tasks", json={"split": "tset"})
        assert r.status_code == 400
        assert r.json() == {"detail": "Invalid split 'tset'; the splits of builtin/math are: train, test."}
        r = http.get("/builtin/wordl/health")
        assert r.status_code == 404
        assert r.json() == {"detail": "Environment 'builtin/wordl' not found. Did you mean 'builtin/wordle'?"}

        rpc = {"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create",
               "params": {"split": "test", "task_index": 3}}
        session = http.post("/builtin/math/mcp", json=rpc).json()["result"]["session_id"]
        rpc = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"session_id": session, "name": "submt", "arguments": {}}}
        observation = http.post("/builtin/math/mcp", json=rpc).json()["result"]
        assert observation["error"]["message"].startswith("'submt' is not a valid tool; the tools are: submit.")
        rpc["params"] = {"session_id": session, "name": "submit", "arguments": {"answer": "-1"}}
        assert http.post("/builtin/math/mcp", json=rpc).json()["result"]["done"] is True
        again = http.post("/builtin/math/mcp", json=rpc).json()["result"]
        assert again["done"] is True and again["error"]["message"].startswith("The episode has already finished")
        http.post("/builtin/math/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "openenv/session/close",
                                             "params": {"session_id": session}})

    # Another team's key: the suggestion comes from what it may see, never a private name of acme.
    with httpx.Client(base_url=f"{server.url}/openenv", headers=outsider.headers, timeout=30) as http:
        r = http.get("/acme/mat/health")
        assert r.status_code == 404 and r.json()["detail"].endswith("Did you mean 'builtin/math'?")
