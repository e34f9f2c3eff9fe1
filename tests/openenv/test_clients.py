"""The unmodified ``openenv`` 0.10.0 clients against a real server process: ``GenericEnvClient``
(what TRL's ``environment_factory`` wraps) over ``/ws`` and ``MCPToolClient`` over ``/mcp`` + ``/ws``.
The clients run their own event loop, so these are sync tests reading the database with the ORM."""

from __future__ import annotations

import asyncio

import pytest
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from orsplatform.catalog.models import Task
from orsplatform.episodes.models import Session, ToolCall
from tests.e2e.helpers import database_dump, wait_for
from tests.openenv.conftest import base_url


def client(server, env: str, headers: dict[str, str]):
    return GenericEnvClient(base_url=base_url(server, env), headers=headers).sync()


def call(name: str, **arguments) -> dict:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def test_a_math_episode_earns_one_for_the_right_answer_and_zero_for_a_wrong_one(server, owner):
    with client(server, "builtin/math", owner.headers) as env:
        first = env.reset(split="test", index=7)
        assert first.reward is None and first.done is False
        meta = first.observation["metadata"]
        assert meta["source_type"] == "ors" and meta["task_spec"]["id"] == "test-7"
        assert meta["task_spec"]["question"] in meta["prompt"][0]["text"]
        tools = env.step({"type": "list_tools"}).observation["tools"]
        assert [t["name"] for t in tools] == ["submit"] and tools[0]["input_schema"]["type"] == "object"

        right = env.step(call("submit", answer=meta["task_spec"]["answer"]))
        assert (right.reward, right.done) == (1.0, True)
        assert right.observation["result"]["blocks"][0]["text"] == "Correct."
        assert right.observation["error"] is None

        # reset on the same socket ends that episode and starts the next (the first split, task 0).
        second = env.reset()
        assert second.observation["metadata"]["task_spec"]["id"] == "train-0"
        wrong = env.step(call("submit", answer="-1"))
        assert (wrong.reward, wrong.done) == (0.0, True)
        state = env.state()
        assert state["step_count"] == 1 and state["split"] == "train" and state["index"] == 0
        assert state["episode_id"] == second.observation["metadata"]["session_id"]

    # Recorded like ORS sessions, tagged with their protocol, and ended when the socket closed.
    rows = wait_for(lambda: (lambda ended: ended if len(ended) == 2 else None)(
        list(Session.objects.filter(status=Session.Status.DELETED).order_by("created_at"))), what="both ended")
    assert Session.objects.count() == 2
    assert {s.protocol for s in rows} == {Session.Protocol.OPENENV}
    assert [s.total_reward for s in rows] == [1.0, 0.0] and all(s.finished for s in rows)
    assert [c.reward for c in ToolCall.objects.order_by("started_at")] == [1.0, 0.0]
    assert rows[0].prompt and rows[0].team_id == owner.team.id


def test_a_wordle_episode_takes_several_steps_and_rewards_at_the_end(server, member):
    with client(server, "builtin/wordle", member.headers) as env:
        start = env.reset(split="test", index=3)
        secret = start.observation["metadata"]["task_spec"]["secret_word"]
        rewards = []
        for word in ("crane", "pilot", secret):
            out = env.step(call("guess", word=word))
            rewards.append((out.reward, out.done))
            if word == secret:
                break
        assert rewards[-1] == (1.0, True) and all(r == (0.0, False) for r in rewards[:-1] if r != (1.0, True))
        assert env.state()["step_count"] == len(rewards)
    session = wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).first(), what="ended")
    assert session.calls == len(rewards) and session.total_reward == 1.0


def test_vision_lists_its_task_tools_and_runs_them(servers, owner):
    server = servers(server="uvicorn")  # the other ASGI server the platform runs on
    index = next(t.index for t in Task.objects.filter(split__environment__slug="vision", split__name="train")
                 .order_by("index") if t.spec.get("zoomable") and t.spec.get("hint"))
    with client(server, "builtin/vision", owner.headers) as env:
        start = env.reset(split="train", index=index)
        assert [b["type"] for b in start.observation["metadata"]["prompt"]] == ["text", "image"]
        names = [t["name"] for t in env.step({"type": "list_tools"}).observation["tools"]]
        assert names == ["answer", "hint", "zoom"]
        # A tool without parameters has no schema in ORS; OpenEnv's model needs one.
        hint_tool = next(t for t in env.step({"type": "list_tools"}).observation["tools"] if t["name"] == "hint")
        assert hint_tool["input_schema"] == {"type": "object", "properties": {}}
        zoom = env.step(call("zoom", factor=2))
        assert [b["type"] for b in zoom.observation["result"]["blocks"]] == ["text", "image"]
        assert (zoom.reward, zoom.done) == (0.0, False)
        hint = env.step(call("hint"))
        assert "starts with" in hint.observation["result"]["blocks"][0]["text"]
        colour = start.observation["metadata"]["task_spec"]["colour"]
        done = env.step(call("answer", colour=colour))
        assert (done.reward, done.done) == (1.0, True)


def test_a_tool_level_failure_is_an_observation_error_and_tool_code_raising_is_an_execution_error(
        server, owner):
    with client(server, "builtin/math", owner.headers) as env:
        env.reset()
        bad = env.step(call("submit", wrong_field=1))
        assert bad.done is False and bad.reward is None
        assert bad.observation["error"]["error_type"] == "execution_error"
        assert bad.observation["error"]["message"].startswith("Invalid arguments for tool 'submit': ")
        unknown = env.step(call("nope"))
        assert "not a valid tool" in unknown.observation["error"]["message"]
        # The socket still serves the episode.
        assert env.step(call("submit", answer="0")).done is True


def test_the_mcp_tool_client_lists_and_calls_tools_on_an_attached_session(server, owner):
    async def episode() -> tuple[list[str], dict, dict]:
        async with MCPToolClient(base_url=base_url(server, "builtin/wordle"),
                                 headers={"Authorization": f"Bearer {owner.token}"}) as env:
            names = [t.name for t in await env.list_tools()]
            reset = await env.reset(split="test", index=0)
            secret = reset.observation.metadata["task_spec"]["secret_word"]
            miss = await env.call_tool("guess", word="crane" if secret != "crane" else "pilot")
            hit = await env.call_tool("guess", word=secret)
            return names, miss, hit

    names, miss, hit = asyncio.run(episode())
    assert names == ["guess"]
    assert (miss["reward"], miss["done"]) == (0.0, False) and miss["tool_name"] == "guess"
    assert (hit["reward"], hit["done"]) == (1.0, True)
    assert "Solved" in hit["result"]["blocks"][0]["text"]
    # The client closed the socket, then the MCP session: the episode ended.
    session = wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).first(), what="ended")
    assert session.protocol == Session.Protocol.OPENENV and session.calls == 2


def test_secrets_given_in_reset_reach_the_environment_and_never_the_audit_log(server, owner):
    secret = "s3cr3t-openenv-value-42"
    with client(server, "builtin/math", owner.headers) as env:
        env.reset(split="test", index=1, secrets={"API_TOKEN": secret, "OTHER": {"value": secret + "-b"}})
        out = env.step(call("submit", answer=secret))
        assert out.observation["metadata"]["secrets_seen"] == ["API_TOKEN", "OTHER"]
    wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).exists(), what="ended")
    assert ToolCall.objects.count() == 1
    assert secret not in database_dump()


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "ors_00000000_00000000000000000000000000000000"}])
def test_a_socket_without_a_valid_key_is_refused_with_an_error_frame(server, headers):
    with client(server, "builtin/math", headers) as env:
        with pytest.raises(RuntimeError, match="SESSION_ERROR"):
            env.reset()
    assert not Session.objects.exists()
