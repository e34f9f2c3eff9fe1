"""The two official clients, unmodified, against a real server subprocess.

``ors.client.ORS`` (ors-sdk) addresses environments in the path; ``openreward.OpenReward`` sends bare
paths with ``X-Deployment``. Both are sync wrappers around their own event loop, so these tests are
plain sync functions and read the database with the sync ORM.
"""

from __future__ import annotations

import base64

import pytest
from openreward import OpenReward
from openreward.api.environments import ToolCallError as OpenRewardToolCallError
from ors.client import ORS, ImageBlock, TextBlock, ToolCallError

from orsplatform.catalog.models import Environment
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.teams.services import api_key_create
from tests.e2e.helpers import SOLUTIONS

# --- ors.client: discovery -------------------------------------------------------------------------


def test_the_ors_client_discovers_splits_tasks_and_tools_of_math(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("math")
        assert env.list_splits() == ["train", "test"]

        tasks = env.list_tasks("test")
        assert len(tasks) == 1000
        assert [t.task_spec["id"] for t in tasks[:3]] == ["test-0", "test-1", "test-2"]
        assert env.num_tasks("test") == 1000
        assert env.num_tasks("train") == 10_000

        task = env.get_task("test", 7)
        assert task.task_spec == tasks[7].task_spec
        assert task.environment_name == "math"

        window = env.get_task_range("test", 10, 13)
        assert [t.task_spec["id"] for t in window] == ["test-10", "test-11", "test-12"]
        tail = env.get_task_range("test", -2)
        assert [t.task_spec["id"] for t in tail] == ["test-998", "test-999"]

        tools = env.list_tools()
        assert [t.name for t in tools] == ["submit"]
        assert "answer" in tools[0].input_schema["properties"]
        anthropic = env.list_tools(format="anthropic")
        assert anthropic[0]["name"] == "submit" and anthropic[0]["input_schema"]["type"] == "object"

    # Discovery opened throwaway sids only; none of them became an episode.
    assert not Session.objects.exists()


# --- ors.client: episodes ----------------------------------------------------------------------------


def test_an_ors_client_episode_from_a_task_object_earns_reward_one(any_server, owner):
    with ORS(base_url=any_server.url, api_key=owner.token) as client:
        env = client.environment("math")
        task = env.get_task("test", 7)
        with env.session(task=task) as session:
            sid = session.sid
            prompt = session.get_prompt()
            assert isinstance(prompt[0], TextBlock)
            assert task.task_spec["question"] in prompt[0].text
            assert [t.name for t in session.list_tools()] == ["submit"]

            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0
            assert out.finished is True
            assert out.metadata["correct"] is True
            assert out.blocks[0].text == "Correct."

            # The episode is over: a further call is a tool-level error, not a new reward.
            with pytest.raises(ToolCallError, match="already finished"):
                session.call_tool("submit", {"answer": task.task_spec["answer"]})

    row = Session.objects.get(sid=sid)
    assert row.status == Session.Status.DELETED
    assert row.environment.full_name == "builtin/math"
    assert row.team_id == owner.team.id
    assert row.task_spec == task.task_spec
    assert row.calls == 2 and row.total_reward == 1.0 and row.finished is True
    calls = list(ToolCall.objects.filter(session=row).order_by("started_at"))
    assert [(c.name, c.status, c.reward) for c in calls] == [
        ("submit", ToolCall.Status.OK, 1.0), ("submit", ToolCall.Status.ERROR, None)]
    assert calls[0].input == {"answer": task.task_spec["answer"]}
    assert calls[0].finished_at is not None


def test_an_ors_client_episode_from_split_and_index_plays_that_task(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("math")
        expected = env.get_task("train", 5).task_spec
        # This form sends no env_name: the platform falls back to its default environment (math).
        with env.session(split="train", index=5) as session:
            sid = session.sid
            prompt = session.get_prompt()
            assert expected["question"] in prompt[0].text
            wrong = str(int(expected["answer"]) + 1)
            out = session.call_tool("submit", {"answer": wrong})
            assert out.reward == 0.0 and out.finished is True and out.metadata["correct"] is False

    row = Session.objects.get(sid=sid)
    assert (row.split, row.task_index, row.task_spec) == ("train", 5, expected)
    assert row.status == Session.Status.DELETED
    assert row.total_reward == 0.0 and row.finished is True


def test_an_ors_client_split_and_index_episode_goes_to_the_environment_its_key_is_bound_to(server, owner):
    wordle = Environment.objects.get(team__slug="builtin", slug="wordle")
    bound = api_key_create(team=owner.team, name="wordle-only", scopes=["sessions"], environment=wordle)
    with ORS(base_url=server.url, api_key=bound.token) as client:
        env = client.environment("wordle")
        secret = env.get_task("test", 2).task_spec["secret_word"]
        with env.session(split="test", index=2) as session:
            sid = session.sid
            assert "five-letter" in session.get_prompt()[0].text
            out = session.call_tool("guess", {"word": secret})
            assert out.reward == 1.0 and out.finished is True

    row = Session.objects.get(sid=sid)
    assert row.environment_id == wordle.id and row.task_spec["secret_word"] == secret


def test_a_wordle_game_over_several_calls_pays_only_at_the_end(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("wordle")
        task = env.get_task("test", 0)
        secret = task.task_spec["secret_word"]
        wrong = [w for w in ("crane", "pilot", "mound") if w != secret][:2]
        with env.session(task=task) as session:
            sid = session.sid
            assert "five-letter" in session.get_prompt()[0].text
            for turn, word in enumerate(wrong, start=1):
                out = session.call_tool("guess", {"word": word})
                assert out.reward == 0.0 and out.finished is False
                assert out.metadata["turn"] == turn and out.metadata["feedback"] != "GGGGG"
            out = session.call_tool("guess", {"word": secret})
            assert out.reward == 1.0 and out.finished is True
            assert out.metadata == {"feedback": "GGGGG", "turn": 3, "turns_left": 3}
            assert "Solved in 3 turns" in out.blocks[0].text

    row = Session.objects.get(sid=sid)
    assert row.calls == 3 and row.total_reward == 1.0 and row.finished is True
    rewards = list(ToolCall.objects.filter(session=row).order_by("started_at").values_list("reward", "finished"))
    assert rewards == [(0.0, False), (0.0, False), (1.0, True)]


def test_a_vision_prompt_carries_a_png_image_and_task_specific_tools(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("vision")
        task = next(t for t in env.get_task_range("test", 0, 20) if t.task_spec["zoomable"])
        with env.session(task=task) as session:
            prompt = session.get_prompt()
            assert isinstance(prompt[0], TextBlock) and "colour" in prompt[0].text
            image = prompt[1]
            assert isinstance(image, ImageBlock) and image.mimeType == "image/png"
            assert base64.b64decode(image.data).startswith(b"\x89PNG\r\n\x1a\n")

            names = {t.name for t in session.list_tools()}
            assert {"answer", "zoom"} <= names
            assert ("hint" in names) == bool(task.task_spec.get("hint"))

            zoomed = session.call_tool("zoom", {"factor": 2})
            assert zoomed.finished is False
            assert any(isinstance(b, ImageBlock) and b.mimeType == "image/png" for b in zoomed.blocks)

            out = session.call_tool("answer", {"colour": task.task_spec["colour"]})
            assert out.reward == 1.0 and out.finished is True


def test_a_code_run_of_a_correct_solution_passes_every_test(server, owner):
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("code")
        task = env.get_task("train", 0)
        spec = task.task_spec
        with env.session(task=task) as session:
            assert spec["entry"] in session.get_prompt()[0].text
            assert {t.name for t in session.list_tools()} == {"run", "submit"}

            wrong = session.call_tool("run", {"code": f"def {spec['entry']}(*args):\n    return None\n"})
            assert wrong.finished is False and wrong.reward < 1.0

            out = session.call_tool("run", {"code": SOLUTIONS[spec["id"]]})
            total = len(spec["tests"])
            assert out.metadata == {"passed": total, "total": total, "timed_out": False}
            assert out.reward == 1.0 and out.finished is True
            assert f"Passed {total}/{total} tests" in out.blocks[0].text


# --- openreward ------------------------------------------------------------------------------------


def test_the_openreward_client_discovers_math_through_x_deployment(server, owner, openreward_at):
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        assert env.deployment_name == "builtin/math"
        assert env.list_splits() == ["train", "test"]
        tasks = env.list_tasks("test")
        assert len(tasks) == 1000
        assert tasks[0].environment_name == "builtin/math"
        assert tasks[0].task_spec["id"] == "test-0"
        task = env.get_task("test", 3)
        assert task.task_spec == tasks[3].task_spec
        assert task.environment_name == "builtin/math"
        assert env.num_tasks("train") == 10_000
        assert [t.task_spec["id"] for t in env.get_task_range("test", 0, 2)] == ["test-0", "test-1"]
        assert [t.name for t in env.list_tools()] == ["submit"]
    finally:
        client.close()
    assert not Session.objects.exists()


def test_an_openreward_episode_from_a_task_ends_deleted_in_the_database(any_server, owner, openreward_at):
    openreward_at(any_server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        task = env.get_task("test", 3)
        with env.session(task=task) as session:
            sid = session.sid
            assert Session.objects.get(sid=sid).status in (Session.Status.CREATING, Session.Status.READY)
            prompt = session.get_prompt()
            assert task.task_spec["question"] in prompt[0].text
            assert [t.name for t in session.list_tools()] == ["submit"]
            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0 and out.finished is True
            with pytest.raises(OpenRewardToolCallError) as excinfo:
                session.call_tool("submit", {"answer": "0"})
            assert excinfo.value.reason == "episode_finished"
    finally:
        client.close()

    row = Session.objects.get(sid=sid)
    assert row.status == Session.Status.DELETED
    assert row.ended_at is not None
    assert row.environment.full_name == "builtin/math"
    assert row.calls == 2 and row.total_reward == 1.0 and row.finished is True


def test_an_openreward_episode_from_split_and_index_plays_that_task(server, owner, openreward_at):
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        expected = env.get_task("train", 5).task_spec
        with env.session(split="train", index=5) as session:
            sid = session.sid
            assert expected["question"] in session.get_prompt()[0].text
            out = session.call_tool("submit", {"answer": expected["answer"]})
            assert out.reward == 1.0 and out.finished is True
            assert out.metadata["correct"] is True
    finally:
        client.close()

    row = Session.objects.get(sid=sid)
    assert (row.split, row.task_index, row.status) == ("train", 5, Session.Status.DELETED)
    call = ToolCall.objects.get(session=row)
    assert (call.name, call.status, call.reward, call.finished) == ("submit", ToolCall.Status.OK, 1.0, True)


def test_the_openreward_client_gets_404_for_an_unknown_deployment(server, owner, openreward_at):
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/no-such-env")
        with pytest.raises(Exception, match="Deployment not found"):
            env.list_splits()
    finally:
        client.close()
