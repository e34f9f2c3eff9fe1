"""Team B can neither see nor launch runs on team A's agents or private environments; a run keeps the
environment version it was launched on."""

from __future__ import annotations

import shutil

import pytest
from django.conf import settings as django_settings

from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session
from tests.evals.conftest import api, launch, register, wait_run


@pytest.fixture
def private_math(owner):
    environment_publish(team=owner.team, source_dir=django_settings.ORS_ENVS_DIR / "math", slug="secret-math",
                        visibility="private")
    return f"{owner.team.slug}/secret-math"


def test_a_team_runs_its_own_agent_on_its_private_environment(owner, agents, private_math):
    agent = register(owner, agents, "solver", "message")
    run = wait_run(owner, launch(owner, agent["id"], environment=f"{private_math}@1", stop=3)["id"])
    assert run["status"] == "finished" and run["environment"] == private_math and run["version"] == 1


def test_another_team_can_neither_see_nor_use_a_teams_agents_and_runs(owner, outsider, agents, private_math):
    agent = register(owner, agents, "solver", "none")
    run = wait_run(owner, launch(owner, agent["id"], stop=2)["id"])
    theirs = api(outsider)
    assert theirs.get("/api/v1/agents").json()["agents"] == []
    assert theirs.get(f"/api/v1/agents/{agent['id']}").status_code == 404
    assert theirs.post(f"/api/v1/agents/{agent['id']}/ping").status_code == 404
    assert theirs.delete(f"/api/v1/agents/{agent['id']}").status_code == 404
    assert theirs.get("/api/v1/eval-runs").json()["runs"] == []
    for method, url in (("get", ""), ("post", "/cancel"), ("post", "/resume")):
        assert getattr(theirs, method)(f"/api/v1/eval-runs/{run['id']}{url}").status_code == 404
    r = theirs.post("/api/v1/eval-runs", {"agent": agent["id"], "environment": "builtin/math", "split": "test",
                                          "stop": 2}, format="json")
    assert r.status_code == 400 and r.json()["detail"] == "No such agent."
    r = theirs.get("/api/v1/leaderboards/builtin/math", {"split": "test"})
    assert r.status_code == 200 and r.json()["rows"] == []
    assert theirs.get(f"/api/v1/leaderboards/{private_math}", {"split": "test"}).status_code == 404


def test_another_teams_private_environment_cannot_be_evaluated(owner, outsider, agents, private_math):
    their_agent = register(outsider, agents, "solver", "none")
    for ref in (private_math, f"{private_math}@1"):
        r = api(outsider).post("/api/v1/eval-runs", {"agent": their_agent["id"], "environment": ref,
                                                     "split": "test", "stop": 2}, format="json")
        assert r.status_code == 400 and r.json()["detail"] == f"Environment {ref!r} not found."


def test_runs_need_a_key_with_the_sessions_scope(owner, agents):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/eval-runs").status_code == 401
    assert APIClient().post("/api/v1/agents", {}, format="json").status_code == 401


def test_a_run_keeps_the_version_it_was_launched_on_when_a_new_one_is_published(owner, agents, private_math, tmp_path):
    from orsplatform.evals import services as eval_services
    from orsplatform.evals.models import Agent

    agent = Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])
    run = eval_services.eval_run_launch(team=owner.team, agent=agent, environment=private_math, split="test",
                                        stop=3, enqueue=False)  # launched (and pinned) before version 2 exists
    changed = tmp_path / "math"
    shutil.copytree(django_settings.ORS_ENVS_DIR / "math", changed)
    (changed / "README.md").write_text("# Math, version 2\n")
    assert environment_publish(team=owner.team, source_dir=changed, slug="secret-math").version.number == 2
    assert api(owner).post(f"/api/v1/eval-runs/{run.id}/resume", {}, format="json").status_code == 200
    done = wait_run(owner, run.id)
    assert done["status"] == "finished" and done["version"] == 1
    sids = [e["sid"] for e in done["episodes"]]
    assert set(Session.objects.filter(sid__in=sids).values_list("version__number", flat=True)) == {1}
