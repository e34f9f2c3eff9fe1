"""Cancel stops a run at once and keeps what was scored; resume runs only the episodes not yet scored."""

from __future__ import annotations

import pytest

from orsplatform.episodes.models import Session
from orsplatform.evals.models import EvalEpisode
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import api, launch, register, wait_run


def test_cancel_keeps_scored_episodes_and_resume_runs_only_the_rest(owner, agents):
    agent = register(owner, agents, "solver", "delta")
    run = launch(owner, agent["id"], stop=300, concurrency=2)
    wait_run(owner, run["id"], until=lambda r: r["done"] >= 5)
    r = api(owner).post(f"/api/v1/eval-runs/{run['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    # The worker sees the cancel within a second: no episode stays open, none is left running. (An
    # agent session whose PUT was in flight cannot be deleted: its id never arrived.)
    cancelled = wait_run(owner, run["id"], until=lambda r: r["running"] == 0, timeout=30)
    assert cancelled["status"] == "cancelled" and 5 <= cancelled["done"] < 300
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
