"""Cancel stops a run at once and keeps what was scored; resume runs only the episodes not yet scored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from orsplatform.episodes.models import Session, ToolCall
from orsplatform.evals import services
from orsplatform.evals.models import Agent, EvalEpisode, EvalRun
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import api, database_dump, launch, register, wait_run
from tests.fixtures.celery import wait_until


def test_cancel_keeps_scored_episodes_and_resume_runs_only_the_rest(owner, agents):
    agent = register(owner, agents, "solver", "delta")
    run = launch(owner, agent["id"], stop=300, concurrency=2)
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 5)
    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # The worker sees the cancel within a second: no episode stays open, none is left running, and
    # every agent session it opened was deleted (one whose PUT was in flight too).
    cancelled = wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    assert cancelled["status"] == "cancelled" and 5 <= cancelled["done"] < 300
    # An episode stops counting as running before its agent session's DELETE has been answered.
    wait_until(lambda: agents.stats()["open"] == 0, 10, "every agent session deleted")
    assert not Session.objects.filter(sid__in=[e["sid"] for e in cancelled["episodes"] if e["sid"]],
                                      status__in=("creating", "ready")).exists()
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


@pytest.mark.parametrize("stream", ["none", "message"])
def test_a_cancel_while_put_session_is_in_flight_still_deletes_the_agent_session(owner, agents, stream):
    # `slowput` opens the session at once and answers its PUT only seconds later: in JSON mode the id
    # comes with that late reply, in SSE mode first (session_start) with the rest of the turn late.
    agent = register(owner, agents, "slowput", stream)
    run = launch(owner, agent["id"], stop=6, concurrency=2)
    wait_until(lambda: agents.stats()["puts_in_flight"] == 2, 30, "two PUT /session in flight at the agent")
    assert api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel").status_code == 200
    cancelled = wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    assert cancelled["status"] == "cancelled"
    assert cancelled["done"] == 0  # the cancel did land while both PUTs were in flight
    stats = agents.stats()
    assert stats["created"] == 2 and stats["deleted"] == 2 and stats["open"] == 0, stats
    assert stats["posts"] == 0  # the episodes went no further than their PUT
    assert not Session.objects.filter(sid__in=[e["sid"] for e in cancelled["episodes"] if e["sid"]],
                                      status__in=("creating", "ready")).exists()


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


def test_resume_of_a_run_launched_with_secrets_needs_them_again(owner, agents):
    agent = register(owner, agents, "solver", "delta")
    run = launch(owner, agent["id"], stop=200, concurrency=2, secrets={"TOKEN": "v-7781", "OTHER": "w-1"})
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 3)
    api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel")
    wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)

    for body in ({}, {"secrets": {"TOKEN": "v-7781"}}):
        r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", body, format="json")
        assert r.status_code == 400, r.content
        missing = "OTHER, TOKEN" if not body else "OTHER"
        assert r.json()["detail"].endswith(f"(missing: {missing}).") and "v-7781" not in r.json()["detail"]
    assert EvalRun.objects.get(id=run["id"]).status == "cancelled"  # a refused resume changes nothing

    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/resume", {"secrets": {"TOKEN": "v-7781", "OTHER": "w-1"}},
                        format="json")
    assert r.status_code == 200, r.content
    done = wait_run(owner, run["id"], timeout=300)
    assert done["status"] == "finished" and done["done"] == 200
    assert {e["task_index"]: e["reward"] for e in done["episodes"]} == {
        i: expected_reward("test", i) for i in range(200)}
    seen = [c.output["output"]["metadata"]["secrets_seen"] for c in ToolCall.objects.filter(
        session__sid__in=[e["sid"] for e in done["episodes"]], name="submit")]
    assert seen == [["OTHER", "TOKEN"]] * 200  # before the cancel and after the resume alike
    assert "v-7781" not in database_dump()


def test_a_run_stuck_in_queued_is_sent_again_by_resume(owner, agents):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])
    # Launched, but its message never reached a worker (a broker restart lost it).
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test", stop=5,
                                   enqueue=False)
    assert run.status == "queued"
    r = api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {}, format="json")
    assert r.status_code == 200 and r.json()["status"] in ("queued", "running", "finished")
    done = wait_run(owner, run.id)
    assert done["status"] == "finished" and done["done"] == 5
    assert agents.stats()["created"] == 5


def test_only_one_worker_claims_a_run_and_an_older_generation_never_does(owner, agents):
    agent = Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])
    run = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test", stop=5,
                                   enqueue=False)
    first = services.eval_run_claim(run_id=run.id, owner="worker-a", generation=0)
    assert isinstance(first, services.RunPlan) and first.indices == [0, 1, 2, 3, 4]
    # A duplicate of the message, on another worker, while the first holds the lease.
    assert services.eval_run_claim(run_id=run.id, owner="worker-b", generation=0) == services.Claim.TAKEN
    # The first worker dies; once its lease lapses the run may be resumed, as a new generation.
    EvalRun.objects.filter(id=run.id).update(lease_until=timezone.now() - timedelta(seconds=1))
    resumed = services.eval_run_resume(run=EvalRun.objects.get(id=run.id), enqueue=False)
    assert resumed.generation == 1
    # The dead worker's message, redelivered late, is of the old generation: it does not drive the run.
    assert services.eval_run_claim(run_id=run.id, owner="worker-c", generation=0) == services.Claim.STALE
    assert isinstance(services.eval_run_claim(run_id=run.id, owner="worker-c", generation=1), services.RunPlan)
    assert services.eval_run_claim(run_id=run.id, owner="worker-d", generation=1) == services.Claim.TAKEN
    services.eval_run_cancel(run=resumed)
    assert services.eval_run_claim(run_id=run.id, owner="worker-d", generation=1) == services.Claim.ENDED
    # Resumed while the cancelled generation's worker still holds its lease (it is ending its
    # episodes): the new generation waits for it instead of driving beside it.
    services.eval_run_resume(run=EvalRun.objects.get(id=run.id), enqueue=False)
    assert services.eval_run_claim(run_id=run.id, owner="worker-d", generation=2) == services.Claim.BUSY
    services.eval_run_end(run_id=run.id, owner="worker-c")
    assert isinstance(services.eval_run_claim(run_id=run.id, owner="worker-d", generation=2), services.RunPlan)
    EvalRun.objects.filter(id=run.id).update(status="cancelled")  # nothing drives it: end it here
