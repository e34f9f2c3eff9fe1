"""The unmodified `openreward` client logs a training run of rollouts to a live server (messages in
its three formats, rewards, RunInfo and RolloutInfo with steps); the run is read back through the
REST API, and each rollout is linked to the ORS session the same client played for its task."""

from __future__ import annotations

import json

import httpx
from openreward import OpenReward
from openreward.api.rollouts.serializers.base import SystemMessage, UserMessage
from openreward.models import RolloutInfo, RunInfo

from orsplatform.episodes.models import Session
from orsplatform.runs.models import Rollout, RolloutMessage, Run


def _play(client: OpenReward, env, run: str, step: int, index: int, correct: bool) -> str:
    task = env.get_task("test", index)
    answer = task.task_spec["answer"] if correct else "-1"
    rollout = client.rollout.create(run_name=run, environment="builtin/math", split="test",
                                    task_spec=task.task_spec, metadata={"seed": index})
    rollout.log(SystemMessage(content="Answer with the submit tool."))
    rollout.log(UserMessage(content=task.task_spec["question"]))
    call_id = f"call-{run}-{index}"
    # The client logs the first event of an OpenAI message: here its tool call.
    rollout.log_openai_completions({"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "submit", "arguments": json.dumps({"answer": answer})}}]})
    with env.session(task=task) as session:  # the environment's side: a real ORS episode
        out = session.call_tool("submit", {"answer": answer})
    rollout.log_anthropic_message(
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": str(out.reward)}]},
        reward=out.reward, is_finished=True,
        rollout_info=RolloutInfo(task_index=index, current_step=step, temperature=1.0, env_version="1"))
    return rollout.event_id


def test_the_openreward_client_logs_a_run_that_the_rest_api_reads_back(server, owner, member, outsider, openreward_at):
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token, run_info=RunInfo(model_name="tiny-gpt", rl_algorithm="grpo", lr=1e-5))
    try:
        env = client.environments.get("builtin/math")
        ids = [_play(client, env, "grpo-a", step, 2 * step + k, correct=k == 0) for step in range(3) for k in range(2)]
        client.rollout.close()  # flushes the client's buffered batches
    finally:
        client.close()

    run = Run.objects.get(team=owner.team, name="grpo-a")
    assert run.rollouts == 6 and run.messages == 6 * 4 and run.rewarded == 6 and run.reward_sum == 3.0
    assert run.model_name == "tiny-gpt" and run.info["rl_algorithm"] == "grpo"
    rollouts = {r.event_id: r for r in Rollout.objects.filter(run=run)}
    assert set(rollouts) == set(ids)
    first = rollouts[ids[0]]
    assert first.environment.full_name == "builtin/math" and first.version.number == 1
    assert first.finished and first.reward == 1.0 and first.step == 0 and first.task_index == 0
    assert first.tool_calls == 1 and first.info["temperature"] == 1.0
    types = list(RolloutMessage.objects.filter(rollout=first).order_by("index").values_list("type", flat=True))
    assert types == ["system_message", "user_message", "tool_call", "tool_result"]
    # Each rollout found the session the same key played for its task, and took it into its run.
    for event_id, rollout in rollouts.items():
        assert rollout.session is not None, event_id
        assert rollout.session.task_spec == rollout.task_spec and rollout.session.run_name == "grpo-a"
    assert Session.objects.filter(run_name="grpo-a").count() == 6

    api = f"{server.url}/api/v1"
    listed = httpx.get(f"{api}/runs", headers=member.headers).json()["runs"]
    assert [r["name"] for r in listed] == ["grpo-a"]
    assert listed[0]["rollouts"] == 6 and listed[0]["episodes"] == 6 and listed[0]["mean_reward"] == 0.5
    detail = httpx.get(f"{api}/runs/grpo-a", headers=owner.headers).json()
    series = detail["series"]
    assert [p["kind"] for p in series] == ["rollout"] * 6  # a linked session is drawn once, as its rollout
    assert [p["x"] for p in series] == [0, 0, 1, 1, 2, 2]
    assert [p["passed"] for p in series] == [True, False] * 3
    assert all(p["length"] == 4 and p["split"] == "test" and p["version"] == 1 for p in series)
    assert detail["facets"] == {"environments": ["builtin/math"], "versions": [1], "splits": ["test"]}
    trajectory = httpx.get(f"{server.url}{series[0]['trajectory']}", headers=owner.headers).json()
    assert [m["type"] for m in trajectory["messages"]][-1] == "tool_result"
    assert trajectory["session"]["sid"] == series[0]["session"]
    assert [c["name"] for c in trajectory["tool_calls"]] == ["submit"]

    # Another team sees none of it.
    assert httpx.get(f"{api}/runs", headers=outsider.headers).json() == {"runs": []}
    for path in ("/runs/grpo-a", f"/rollouts/{ids[0]}"):
        r = httpx.get(f"{api}{path}", headers=outsider.headers)
        assert r.status_code == 404 and set(r.json()) == {"detail"}
