"""Two training runs with hand-computable curves, written straight through the ORM.

acme/puzzle (two versions). Run "grpo-a": steps 0..9, four rollouts per step on split "train",
version 1; rollout j of step s has reward (s + j) / 12 rounded to 0 or 1 at the ends: reward
s / 9 for j = 0, 1 and 1 - s / 9 for j = 2, 3, so the step's mean is 0.5 and its pass rate counts
the rewards >= 1. Simpler to read: `rewards_a(step)`. Each rollout has 3 messages (system, assistant,
tool_call) except at step 9 (5). The first rollout of step 0 is linked to a session with 2 tool calls.
The last rollout of step 5 has an error.
Run "grpo-b": steps 0..9, two rollouts per step, split "train" on version 1 and "test" on version 2,
reward step / 9 (both), 2 messages each.
Run "keyed": two ORS sessions only (no rollouts), ended, rewards 1 and 0, on version 2.
globex has a run "grpo-a" of its own (one rollout, reward 1) that acme must never see.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.runs.models import Rollout, RolloutMessage, Run
from orsplatform.teams.models import ApiKey, Team
from tests.analytics.seed import make_environment

STEPS = 10


def rewards_a(step: int) -> list[float]:
    return [step / 9, step / 9, 1 - step / 9, 1.0 if step >= 5 else 0.0]


def rewards_b(step: int) -> list[float]:
    return [step / 9, step / 9]


@dataclass
class RunsSeeded:
    puzzle: Environment
    v1: EnvironmentVersion
    v2: EnvironmentVersion
    linked_session: Session | None = None
    first_rollout: Rollout | None = None
    rollouts: dict[str, list[Rollout]] = field(default_factory=dict)


def _run(team: Team, name: str, at: datetime) -> Run:
    return Run.objects.create(team=team, name=name, first_seen_at=at, last_seen_at=at, model_name="tiny-gpt2",
                              info={"model_name": "tiny-gpt2", "rl_algorithm": "grpo"})


def _rollout(run: Run, *, seq: int, step: int | None, env: Environment | None, version: EnvironmentVersion | None,
             split: str, reward: float | None, messages: int, at: datetime, key: ApiKey | None,
             error: str = "", session: Session | None = None, env_name: str = "") -> Rollout:
    rollout = Rollout.objects.create(
        team=run.team, run=run, api_key=key, event_id=str(uuid.uuid4()), seq=seq, name=f"{run.name}-{seq}",
        environment_name=env_name or (env.full_name if env else ""), environment=env, version=version,
        split=split, task_spec={"question": f"task {seq}"}, task_index=seq % 5, step=step, session=session,
        started_at=at, created_at=at, last_event_at=at, messages=messages, tool_calls=1, reward=reward,
        finished=True, error=error, run_info={"model_name": "tiny-gpt2", "step": step})
    kinds = ["system_message", "assistant_message", "tool_call", "tool_result", "assistant_message"]
    RolloutMessage.objects.bulk_create([
        RolloutMessage(rollout=rollout, index=i, event_id=str(uuid.uuid4()), type=kinds[i % len(kinds)],
                       content=f"message {i} of {rollout.name}", name="submit" if kinds[i % len(kinds)] == "tool_call"
                       else "", reward=reward if i == messages - 1 else None, is_finished=i == messages - 1,
                       timestamp=at + timedelta(milliseconds=i))
        for i in range(messages)])
    return rollout


def seed_runs(*, acme: Team, globex: Team | None = None, now: datetime | None = None) -> RunsSeeded:
    now = now or timezone.now()
    key = ApiKey.objects.filter(team=acme).order_by("created_at").first()
    puzzle, (v1, v2) = make_environment(acme, "puzzle")
    out = RunsSeeded(puzzle=puzzle, v1=v1, v2=v2)
    start = now - timedelta(minutes=30)
    # The linked session: same key and task as the first rollout of grpo-a.
    linked = Session.objects.create(
        sid="acme-linked-0", team=acme, api_key=key, environment=puzzle, version=v1, task_spec={"question": "task 1"},
        split="train", task_index=1, status="deleted", created_at=start, ready_at=start, last_activity_at=start,
        ended_at=start + timedelta(seconds=5), calls=2, total_reward=0.0, finished=True, run_name="grpo-a")
    ToolCall.objects.bulk_create([
        ToolCall(session=linked, task_id=f"acme-linked-0-{n}", name="submit", input={"answer": n}, status="ok",
                 output={"ok": True, "output": {"blocks": [{"type": "text", "text": f"tool result {n}"}],
                                                "metadata": None, "reward": 0.0, "finished": n == 1}},
                 reward=0.0, finished=n == 1, started_at=start + timedelta(seconds=n),
                 finished_at=start + timedelta(seconds=n, milliseconds=20))
        for n in range(2)])
    out.linked_session = linked

    run_a = _run(acme, "grpo-a", start)
    seq = 0
    out.rollouts["grpo-a"] = []
    for step in range(STEPS):
        for j, reward in enumerate(rewards_a(step)):
            seq += 1
            out.rollouts["grpo-a"].append(_rollout(
                run_a, seq=seq, step=step, env=puzzle, version=v1, split="train", reward=reward,
                messages=5 if step == 9 else 3, at=start + timedelta(seconds=seq), key=key,
                error="tool crashed" if (step, j) == (5, 3) else "", session=linked if seq == 1 else None))
    out.first_rollout = out.rollouts["grpo-a"][0]

    run_b = _run(acme, "grpo-b", start)
    seq = 0
    out.rollouts["grpo-b"] = []
    for step in range(STEPS):
        for j, reward in enumerate(rewards_b(step)):
            seq += 1
            out.rollouts["grpo-b"].append(_rollout(
                run_b, seq=seq, step=step, env=puzzle, version=v1 if j == 0 else v2, split="train" if j == 0 else "test",
                reward=reward, messages=2, at=start + timedelta(seconds=seq, milliseconds=500), key=key))

    Run.objects.create(team=acme, name="keyed", first_seen_at=start, last_seen_at=start)
    for i, reward in enumerate([1.0, 0.0]):
        at = start + timedelta(minutes=1, seconds=i)
        Session.objects.create(
            sid=f"acme-keyed-{i}", team=acme, api_key=key, environment=puzzle, version=v2, task_spec={"i": i},
            split="test", task_index=i, status="deleted", created_at=at, ready_at=at, last_activity_at=at,
            ended_at=at, calls=3, total_reward=reward, finished=True, run_name="keyed")

    if globex is not None:
        gkey = ApiKey.objects.filter(team=globex).order_by("created_at").first()
        g_run = _run(globex, "grpo-a", start)
        _rollout(g_run, seq=1, step=0, env=None, version=None, split="train", reward=1.0, messages=1, at=start,
                 key=gkey, env_name="globex/secret-env")
    # The rollout counters the ingest keeps (the runs list reads them, never the messages).
    for run in Run.objects.all():
        rows = list(Rollout.objects.filter(run=run).values_list("messages", "reward"))
        run.rollouts = len(rows)
        run.messages = sum(m for m, _ in rows)
        run.reward_sum = sum(r for _, r in rows if r is not None)
        run.rewarded = sum(1 for _, r in rows if r is not None)
        run.last_seen_at = max([run.last_seen_at, *Rollout.objects.filter(run=run).values_list("created_at", flat=True)])
        run.save()
    return out
