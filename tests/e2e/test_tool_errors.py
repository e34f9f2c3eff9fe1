"""Tool-level failures (``{"ok": false}``) and failures inside environment code (``event: error``),
as the official clients see them through a real server."""

from __future__ import annotations

import httpx
import pytest
from openreward import OpenReward
from openreward.api.environments import ToolCallError as OpenRewardToolCallError
from openreward.api.environments import ToolFailed
from openreward.api.environments.types import Task as OpenRewardTask
from ors.client import ORS, ToolCallError

from orsplatform.episodes.models import Session, ToolCall
from tests.e2e.helpers import parse_sse, raw_call, raw_episode


def test_the_ors_client_gets_tool_errors_for_unknown_tools_and_bad_input_and_can_go_on(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("math")
        task = env.get_task("test", 21)
        with env.session(task=task) as session:
            sid = session.sid
            # The errors name the fix: the tools there are, and what is wrong with the arguments, in one line.
            with pytest.raises(ToolCallError, match="'no_such_tool' is not a valid tool; the tools are: submit."):
                session.call_tool("no_such_tool", {})
            with pytest.raises(ToolCallError, match="^Invalid arguments for tool 'submit': answer: Field required") as bad:
                session.call_tool("submit", {"wrong_field": 1})
            assert "\n" not in str(bad.value)
            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0 and out.finished is True

    statuses = list(ToolCall.objects.filter(session__sid=sid).order_by("started_at").values_list("name", "status"))
    assert statuses == [("no_such_tool", "error"), ("submit", "error"), ("submit", "ok")]
    assert Session.objects.get(sid=sid).total_reward == 1.0


def test_the_openreward_client_gets_the_reason_of_each_tool_error(server, owner, openreward_at):
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        with env.session(split="test", index=22) as session:
            with pytest.raises(OpenRewardToolCallError) as excinfo:
                session.call_tool("no_such_tool", {})
            assert excinfo.value.reason == "not_found"
            with pytest.raises(OpenRewardToolCallError) as excinfo:
                session.call_tool("submit", {})
            assert excinfo.value.reason == "input_validation"
            assert session.call_tool("submit", {"answer": "0"}).finished is True
    finally:
        client.close()


def test_an_exception_in_tool_code_is_an_sse_error_event_and_an_error_audit_row(server, owner, openreward_at):
    # A wordle task without a secret word: the guess tool itself raises ValueError.
    broken = {"id": "broken"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "wordle", task_spec=broken)
        r = raw_call(http, owner.headers, "wordle", sid, {"name": "guess", "input": {"word": "crane"}})
        assert r.status_code == 200
        events = parse_sse(r.text)
        assert events[0][0] == "task_id"
        assert events[-1][0] == "error" and "secret_word" in events[-1][1]
        assert not [e for e, _ in events if e in ("chunk", "end")]
    row = ToolCall.objects.get(task_id=events[0][1])
    assert row.status == ToolCall.Status.ERROR and "ValueError" in row.error and row.output is None

    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/wordle")
        task = OpenRewardTask(server_name="wordle", environment_name="builtin/wordle", task_spec=broken,
                              namespace="builtin")
        with env.session(task=task) as session:
            with pytest.raises(ToolFailed, match="secret_word"):
                session.call_tool("guess", {"word": "crane"})
    finally:
        client.close()
