"""Cancel stops a run at once and keeps what was scored; resume runs only the episodes not yet scored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orsplatform.episodes.models import Session
from orsplatform.evals import services
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from orsplatform.evals.tasks import resume_orphaned_runs
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import api, launch, register, wait_run
from tests.fixtures.celery import wait_until


def test_cancel_keeps_scored_episodes_and_resume_runs_only_the_rest(owner, agents):
    agent = register(owner, agents, "solver", "delta")
    run = launch(owner, agent["id"], stop=300, concurrency=2)
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 5)
    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # The worker sees the cancel within a second: no episode stays open, none is left running.
    cancelled = wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    assert cancelled["status"] == "cancelled" and 5 <= cancelled["done"] < 300
    # Every ORS session the run opened is ended too; the end rows go through the gateway's batched
    # writer, which may commit just after the episode rows, so this waits (with a deadline).
    sids = [e["sid"] for e in cancelled["episodes"] if e["sid"]]
    wait_until(lambda: not Session.objects.filter(sid__in=sids, status__in=("creating", "ready")).exists(),
               10, "the cancelled run's sessions to be ended")
    scored = {e["task_index"]: e["sid"] for e in cancelled["episodes"] if e["status"] == "scored"}
    assert api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel").status_code == 400

    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] in ("queued", "running")
    assert api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {}, format="json").status_code == 400
    done = wait_run(owner, run["id"], timeout=300)
    assert done["status"] == "finished" and done["done"] == 300
    assert {e["task_index"]: e["reward"] for e in done["episodes"]} == {
        i: expected_reward("test", i) for i in range(300)}
    # Episodes scored before the cancel were not run again.
    assert {e["task_index"]: e["sid"] for e in done["episodes"] if e["task_index"] in scored} == scored
    # Only the episodes open at the cancel (at most `concurrency`) were started twice.
    assert 300 <= agents.stats()["created"] <= 302


@pytest.mark.parametrize("stream", ["none", "delta"])
def test_a_cancel_during_an_agents_put_session_still_deletes_the_agents_session(owner, agents, stream):
    # `sluggish` takes a second over PUT /session: most cancels land while one is in flight. In
    # "none" its id comes only with the reply, which the cancel waits for; in "delta" it comes with
    # session_start, and the cancel deletes the session without waiting for the turn.
    agent = register(owner, agents, "sluggish", stream)
    run = launch(owner, agent["id"], stop=40, concurrency=4)
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 4 and r["running"] == 4)
    assert api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel").status_code == 200
    wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    stats = agents.stats()
    assert stats["created"] > 4 and stats["open"] == 0, stats  # every session the run opened was deleted
    assert stats["deleted"] == stats["created"]


def test_a_queued_run_whose_message_was_lost_resumes_once(owner, agents):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                   stop=8, concurrency=2, enqueue=False)  # its message never reaches a worker
    assert EvalRun.objects.get(id=run.id).status == "queued"
    r = api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {}, format="json")
    assert r.status_code == 200, r.content
    # Its new message vouches for it now (or a worker already took it): a second click is refused.
    again = api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {}, format="json")
    assert again.status_code == 400 and "it" in again.json()["detail"]
    done = wait_run(owner, run.id)
    assert done["status"] == "finished" and done["done"] == 8
    assert agents.stats()["created"] == 8 and agents.stats()["max_open"] <= 2


def test_a_finished_run_resumes_nothing(owner, agents):
    agent = register(owner, agents, "solver", "none")
    run = wait_run(owner, launch(owner, agent["id"], stop=3)["id"])
    before = list(EvalEpisode.objects.filter(run_id=run["id"]).values_list("sid", flat=True))
    api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {}, format="json")
    after = wait_run(owner, run["id"])
    assert after["status"] == "finished"
    assert list(EvalEpisode.objects.filter(run_id=run["id"]).values_list("sid", flat=True)) == before


@pytest.mark.parametrize("body", [{"stop": 5000}, {"start": 3, "stop": 3}, {"split": "nope"}, {"concurrency": 0},
                                  {"concurrency": 1000}, {"max_turns": 0}, {"environment": "builtin/math@99"}])
def test_bad_launches_are_a_400(owner, agents, body):
    agent = register(owner, agents, "solver", "none")
    full = {"agent": agent["id"], "environment": "builtin/math", "split": "test", "start": 0, "stop": 5, **body}
    r = api(owner).post("/api/v1/eval-runs", full, format="json")
    assert r.status_code == 400 and r.json()["detail"]


def test_the_leaderboard_ranks_runs_on_one_environment_and_split(owner, agents):
    solver = register(owner, agents, "solver", "none")
    asker = register(owner, agents, "asker", "none")
    wait_run(owner, launch(owner, solver["id"], stop=6)["id"])
    wait_run(owner, launch(owner, asker["id"], stop=6)["id"])
    rows = api(owner).get("/api/v1/leaderboards/builtin/math", {"split": "test"}).json()["rows"]
    assert [r["agent"] for r in rows] == ["asker-none", "solver-none"]
    assert rows[0]["pass_rate"] == 1.0 and rows[0]["episodes"] == 6 and rows[0]["version"] == 1
    assert rows[0]["pass_rate_interval"][1] == 1.0 and rows[0]["pass_rate_interval"][0] < 1.0



def _lease(run_id: int, seconds: float, owner: str = "dead-worker:1:abc") -> None:
    """A running run whose lease ends `seconds` from now (long past: what a dead worker leaves)."""
    EvalRun.objects.filter(id=run_id).update(status="running", lease_owner=owner,
                                             lease_until=timezone.now() + timedelta(seconds=seconds))


def test_the_beat_resumes_a_run_whose_worker_died_and_fails_one_that_needs_its_secrets(owner, agents):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])

    def launch_quietly(**extra):
        return services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                        stop=6, enqueue=False, **extra)

    plain, with_secrets, alive = launch_quietly(), launch_quietly(secrets={"TOKEN": "s3cr3t-value-42"}), launch_quietly()
    _lease(plain.id, -3600)
    _lease(with_secrets.id, -3600)
    _lease(alive.id, 30, owner="live-worker:1:abc")

    assert tuple(resume_orphaned_runs.apply().get()) == (1, 1)
    done = wait_run(owner, plain.id)
    assert done["status"] == "finished" and done["done"] == 6
    failed = EvalRun.objects.get(id=with_secrets.id)
    assert failed.status == "failed" and "secrets" in failed.error and "s3cr3t" not in failed.error
    assert EvalRun.objects.get(id=alive.id).status == "running"  # its worker vouches for it
    EvalRun.objects.filter(id=alive.id).update(status="cancelled")
