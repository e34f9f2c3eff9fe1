"""Errors a trainer meets on the ORS face name their fix: the valid splits, the index range, the
tools there are, the closest environment name (only among names the caller may see), bad arguments
as one readable line, and the same finished answer for every call after the episode finished."""

from __future__ import annotations

import uuid

from tests.fixtures.ors import sse_result, start_episode
from tests.ors.support import acalls, sid_headers


async def test_an_unknown_split_lists_the_valid_ones(client, owner):
    for path, body in (("/math/task", {"split": "tset", "index": 0}), ("/math/num_tasks", {"split": "tset"}),
                       ("/math/task_range", {"split": "tset"})):
        r = await client.post(path, headers=owner.headers, json=body)
        assert r.status_code == 400
        assert r.json() == {"detail": "Invalid split 'tset'; the splits of builtin/math are: train, test."}
    sid = str(uuid.uuid4())
    r = await client.post("/math/create", headers=sid_headers(owner, sid), json={"split": "tset", "index": 0})
    assert r.status_code == 400 and "the splits of builtin/math are: train, test." in r.json()["detail"]


async def test_an_index_out_of_range_gives_the_range(client, owner):
    num = (await client.post("/math/num_tasks", headers=owner.headers, json={"split": "test"})).json()["num_tasks"]
    r = await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": num})
    assert r.status_code == 400
    assert r.json() == {"detail": f"Invalid index {num}: split 'test' has {num} tasks, indices 0 to {num - 1}."}
    r = await client.post("/math/create", headers=sid_headers(owner, str(uuid.uuid4())),
                          json={"split": "test", "index": num + 5})
    assert r.status_code == 400 and r.json()["detail"].endswith(f"indices 0 to {num - 1}.")
    r = await client.post("/math/create", headers=sid_headers(owner, str(uuid.uuid4())),
                          json={"split": "test", "index": -1})
    assert r.status_code == 400 and r.json() == {"detail": "Invalid index -1: task indices start at 0."}


async def test_an_unknown_environment_suggests_the_closest_name(client, owner):
    r = await client.get("/builtin/maths/tools", headers=owner.headers)
    assert r.status_code == 404
    assert r.json() == {"detail": "Environment 'builtin/maths' not found. Did you mean 'builtin/math'?"}
    r = await client.get("/wordel/splits", headers=owner.headers)
    assert r.json() == {"detail": "Environment 'wordel' not found. Did you mean 'builtin/wordle'?"}
    r = await client.get("/splits", headers={**owner.headers, "X-Deployment": "bultin/vision"})
    assert r.json() == {"detail": "Deployment not found: 'bultin/vision'. Did you mean 'builtin/vision'?"}
    r = await client.get("/zzzzzz/tools", headers=owner.headers)
    assert r.status_code == 404
    assert r.json() == {"detail": "Environment 'zzzzzz' not found. No environment this key may use has a similar name."}


async def test_the_suggestion_never_names_another_teams_private_environment(client, owner, outsider, probe):
    r = await client.get("/acme/prob/tools", headers=owner.headers)
    assert r.json()["detail"].endswith("Did you mean 'acme/probe'?")  # the owner's own
    for ref in ("acme/prob", "prob", "acme/probe"):
        r = await client.get(f"/{ref}/tools", headers=outsider.headers)
        assert r.status_code == 404 and "probe'?" not in r.json()["detail"], r.json()


async def test_an_unknown_tool_lists_the_tools_and_bad_arguments_are_one_line(client, owner):
    task = (await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": 2})).json()["task"]
    sid = await start_episode(client, owner.headers, split="test", index=2)
    h = sid_headers(owner, sid)
    result = sse_result((await client.post("/math/call", headers=h, json={"name": "submt", "input": {}})).text)
    assert result == {"ok": False, "reason": "not_found",
                      "error": "'submt' is not a valid tool; the tools are: submit. Did you mean 'submit'?"}
    result = sse_result((await client.post("/math/call", headers=h, json={"name": "submit",
                                                                           "input": {"answer": ["1"]}})).text)
    assert result["reason"] == "input_validation"
    assert result["error"] == "Invalid arguments for tool 'submit': answer: Input should be a valid string (got ['1'])."
    result = sse_result((await client.post("/math/call", headers=h, json={"name": "submit", "input": {}})).text)
    assert result["error"] == "Invalid arguments for tool 'submit': answer: Field required."
    # None of it ended the episode, and the audit log has the same words.
    ok = sse_result((await client.post("/math/call", headers=h, json={"name": "submit",
                                                                      "input": {"answer": task["answer"]}})).text)
    assert ok["ok"] is True and ok["output"]["finished"] is True
    rows = await acalls(sid)
    assert [r["status"] for r in rows] == ["error", "error", "error", "ok"]


async def test_every_call_after_the_episode_finished_gets_the_same_finished_answer(client, owner):
    task = (await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": 3})).json()["task"]
    sid = await start_episode(client, owner.headers, split="test", index=3)
    h = sid_headers(owner, sid)
    first = sse_result((await client.post("/math/call", headers=h,
                                          json={"name": "submit", "input": {"answer": task["answer"]}})).text)
    assert first["output"]["finished"] is True
    answers = [sse_result((await client.post("/math/call", headers=h, json={"name": name, "input": tool_input})).text)
               for name, tool_input in (("submit", {"answer": "0"}), ("nope", {}), ("submit", {}))]
    assert all(a == answers[0] for a in answers), answers
    assert answers[0]["ok"] is False and answers[0]["reason"] == "episode_finished"
    assert "start a new one" in answers[0]["error"]
