"""Who may do what with evaluations: on the pages, viewers only look (403 on launch, cancel, resume
and ping, and no such buttons), members and owners act, owners and admins manage agents, another
team sees nothing (404); on the REST API, registering and removing agents needs the manage scope,
and a key bound to one environment evaluates that one only."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import environment_publish
from orsplatform.evals import services
from orsplatform.evals.models import Agent, EvalRun
from orsplatform.teams.services import api_key_create
from tests.evals.conftest import api, register, wait_run
from tests.fixtures.tenancy import Person


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


def launch_form(agent_id: int, stop: int = 2) -> dict:
    return {"agent": agent_id, "environment": "builtin/math", "split": "test", "start": 0, "stop": stop,
            "concurrency": 1, "max_turns": 3}


@pytest.fixture
def agent(owner, agents) -> Agent:
    return Agent.objects.get(id=register(owner, agents, "solver", "none")["id"])


@pytest.fixture
def queued_run(owner, agent) -> EvalRun:
    # Launched without a worker message: it stays queued until someone resumes it.
    return services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                    stop=2, enqueue=False)


def test_a_viewer_cannot_launch_cancel_resume_or_ping_and_nothing_changes(owner, viewer, agent, queued_run):
    client = login(viewer)
    team = owner.team.slug
    assert client.post(f"/aap/{team}/", launch_form(agent.id)).status_code == 403
    assert EvalRun.objects.filter(team=owner.team).count() == 1
    assert client.post(f"/aap/{team}/runs/{queued_run.id}/cancel").status_code == 403
    assert client.post(f"/aap/{team}/runs/{queued_run.id}/resume").status_code == 403
    queued_run.refresh_from_db()
    assert queued_run.status == EvalRun.Status.QUEUED and queued_run.lease_until is None
    Agent.objects.filter(id=agent.id).update(meta={})
    assert client.post(f"/aap/{team}/agents/{agent.id}/ping").status_code == 403
    agent.refresh_from_db()
    assert agent.meta == {}  # /meta was not read
    assert client.post(f"/aap/{team}/agents/{agent.id}/remove").status_code == 403
    assert client.post(f"/aap/{team}/agents/", {"name": "x", "url": "http://127.0.0.1:1", "agent": "solver",
                                                 "stream": "none"}).status_code == 403
    # Looking is allowed.
    assert client.get(f"/aap/{team}/").status_code == 200
    assert client.get(f"/aap/{team}/runs/{queued_run.id}/").status_code == 200
    assert client.get(f"/aap/{team}/agents/").status_code == 200


def test_a_viewer_sees_runs_and_agents_without_any_action_button(owner, viewer, agent, queued_run):
    client = login(viewer)
    team = owner.team.slug
    runs = client.get(f"/aap/{team}/").content.decode()
    assert f"#{queued_run.id}" in runs and 'id="launch"' not in runs and 'id="viewer-note"' in runs
    run = client.get(f"/aap/{team}/runs/{queued_run.id}/").content.decode()
    assert 'id="cancel"' not in run and 'id="resume"' not in run and "/cancel" not in run
    agents = client.get(f"/aap/{team}/agents/").content.decode()
    assert 'data-agent="solver-none"' in agents
    assert 'class="ping"' not in agents and "danger remove" not in agents and 'id="add-agent"' not in agents


def test_a_member_sees_the_buttons_of_members_but_not_those_of_owners(owner, member, agent, queued_run):
    client = login(member)
    team = owner.team.slug
    assert 'id="launch"' in client.get(f"/aap/{team}/").content.decode()
    assert 'id="cancel"' in client.get(f"/aap/{team}/runs/{queued_run.id}/").content.decode()
    agents = client.get(f"/aap/{team}/agents/").content.decode()
    assert 'class="ping"' in agents and "danger remove" not in agents and 'id="add-agent"' not in agents
    owners = login(owner).get(f"/aap/{team}/agents/").content.decode()
    assert 'class="ping"' in owners and "danger remove" in owners and 'id="add-agent"' in owners


def test_a_member_launches_cancels_resumes_and_pings(owner, member, agent, queued_run):
    client = login(member)
    team = owner.team.slug
    r = client.post(f"/aap/{team}/runs/{queued_run.id}/cancel")
    assert r.status_code == 302
    queued_run.refresh_from_db()
    assert queued_run.status == EvalRun.Status.CANCELLED
    assert client.post(f"/aap/{team}/runs/{queued_run.id}/resume").status_code == 302
    assert wait_run(owner, queued_run.id)["status"] == "finished"
    Agent.objects.filter(id=agent.id).update(meta={})
    pinged = client.post(f"/aap/{team}/agents/{agent.id}/ping", follow=True)
    assert "answered /meta: version 1.0.0" in pinged.content.decode()
    r = client.post(f"/aap/{team}/", launch_form(agent.id))
    assert r.status_code == 302
    run_id = int(r["Location"].rstrip("/").rsplit("/", 1)[1])
    assert wait_run(owner, run_id)["status"] == "finished"


def test_an_owner_launches_from_the_page(owner, agent):
    r = login(owner).post(f"/aap/{owner.team.slug}/", launch_form(agent.id))
    assert r.status_code == 302
    assert wait_run(owner, int(r["Location"].rstrip("/").rsplit("/", 1)[1]))["status"] == "finished"


def test_an_outsider_gets_404_for_every_page_and_action_of_the_team(owner, outsider, agent, queued_run):
    client = login(outsider)
    team = owner.team.slug
    for url in (f"/aap/{team}/", f"/aap/{team}/runs/{queued_run.id}/cancel", f"/aap/{team}/runs/{queued_run.id}/resume",
                f"/aap/{team}/agents/{agent.id}/ping"):
        assert client.post(url, launch_form(agent.id)).status_code == 404
    queued_run.refresh_from_db()
    assert queued_run.status == EvalRun.Status.QUEUED
    assert EvalRun.objects.filter(team=owner.team).count() == 1


def test_registering_and_removing_agents_over_the_api_needs_the_manage_scope(owner, member, agents):
    body = {"name": "m", "url": agents.url, "api_key": "k", "agent": "solver", "stream": "none"}
    r = api(member).post("/api/v1/agents", body, format="json")  # member's key: sessions only
    assert r.status_code == 403 and "'manage' scope" in r.json()["detail"]
    assert not Agent.objects.filter(name="m").exists()
    agent = register(owner, agents, "solver", "none")  # owner's key carries manage
    r = api(member).delete(f"/api/v1/agents/{agent['id']}")
    assert r.status_code == 403
    assert Agent.objects.get(id=agent["id"]).deleted_at is None
    # The sessions scope still reads, pings and launches.
    assert api(member).get(f"/api/v1/agents/{agent['id']}").status_code == 200
    assert api(member).post(f"/api/v1/agents/{agent['id']}/ping").status_code == 200
    assert api(owner).delete(f"/api/v1/agents/{agent['id']}").status_code == 204


@pytest.fixture
def bound(owner) -> Person:
    environment_publish(team=owner.team, source_dir=django_settings.ORS_ENVS_DIR / "math", slug="own-math",
                        visibility="private")
    env = Environment.objects.get(team=owner.team, slug="own-math")
    new = api_key_create(team=owner.team, name="bound", scopes=["sessions"], environment=env)
    return Person(username=owner.username, team=owner.team, role=owner.role, token=new.token)


def test_a_key_bound_to_one_environment_evaluates_only_that_one(owner, bound, agent):
    body = {"agent": agent.id, "split": "test", "stop": 2, "concurrency": 1, "max_turns": 3}
    r = api(bound).post("/api/v1/eval-runs", {**body, "environment": "builtin/math"}, format="json")
    assert r.status_code == 403 and "bound to one environment" in r.json()["detail"]
    assert not EvalRun.objects.filter(team=owner.team).exists()
    r = api(bound).post("/api/v1/eval-runs", {**body, "environment": "acme/own-math"}, format="json")
    assert r.status_code == 201
    assert wait_run(owner, r.json()["id"])["status"] == "finished"
    other = services.eval_run_launch(team=owner.team, agent=agent, environment="builtin/math", split="test",
                                     stop=2, enqueue=False)
    assert api(bound).post(f"/api/v1/eval-runs/{other.id}/resume", {}, format="json").status_code == 403
    other.refresh_from_db()
    assert other.status == EvalRun.Status.QUEUED and other.lease_until is None
