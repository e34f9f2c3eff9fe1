"""The evaluation pages: runs, agents, a run, the leaderboard, and the agent's side of an episode on
the trajectory page; team-scoped like the analytics pages."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.evals.models import Agent
from tests.evals.conftest import AGENT_KEY, launch, register, wait_run


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


@pytest.fixture
def finished_run(owner, agents):
    agent = register(owner, agents, "solver", "message")
    run = wait_run(owner, launch(owner, agent["id"], stop=9)["id"])
    looper = register(owner, agents, "looper", "none")
    wait_run(owner, launch(owner, looper["id"], stop=2, max_turns=2)["id"])
    return run


def test_the_run_page_shows_pass_rate_histogram_and_failed_episodes_linking_to_trajectories(owner, finished_run):
    page = login(owner).get(f"/aap/{owner.team.slug}/runs/{finished_run['id']}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert '<progress id="progress" value="9" max="9"' in html
    assert f"{finished_run['pass_rate'] * 100:.1f} %" in html and 'id="histogram"' in html and "<svg" in html
    for episode in finished_run["episodes"]:
        assert f"/analytics/{owner.team.slug}/sessions/{episode['sid']}/" in html  # slowest episodes


def test_failed_episodes_show_their_reason_and_the_trajectory_shows_the_agents_messages(owner, finished_run):
    client = login(owner)
    runs = client.get(f"/aap/{owner.team.slug}/").content.decode()
    looper_run = finished_run["id"] + 1
    assert f"/aap/{owner.team.slug}/runs/{looper_run}/" in runs
    html = client.get(f"/aap/{owner.team.slug}/runs/{looper_run}/").content.decode()
    assert "The agent did not finish the episode within 2 turns." in html
    sid = finished_run["episodes"][0]["sid"]
    trajectory = client.get(f"/analytics/{owner.team.slug}/sessions/{sid}/").content.decode()
    assert 'id="agent-transcript"' in trajectory and "My answer is" in trajectory
    assert "calls <code>submit</code>" in trajectory
    # Woven in: the agent's first turn, then the ORS call it made, then its next turn (if any).
    turn_1, call_1 = trajectory.index("Agent, turn 1"), trajectory.index('id="call-1"')
    assert turn_1 < call_1
    if "Agent, turn 2" in trajectory:
        assert call_1 < trajectory.index("Agent, turn 2")
    assert trajectory.count('id="call-1"') == 1


def test_the_leaderboard_lists_agent_version_episodes_and_pass_rate(owner, finished_run):
    html = login(owner).get(f"/aap/{owner.team.slug}/leaderboard/builtin/math/?split=test").content.decode()
    assert html.count('class="board-row"') == 2
    assert "solver-message" in html and "looper-none" in html and "@1" in html


def test_another_team_sees_none_of_it(owner, outsider, finished_run):
    client = login(outsider)
    for url in (f"/aap/{owner.team.slug}/", f"/aap/{owner.team.slug}/agents/",
                f"/aap/{owner.team.slug}/runs/{finished_run['id']}/",
                f"/aap/{owner.team.slug}/leaderboard/builtin/math/"):
        assert client.get(url).status_code == 404, url
    assert client.get(f"/aap/{outsider.team.slug}/runs/{finished_run['id']}/").status_code == 404
    board = client.get(f"/aap/{outsider.team.slug}/leaderboard/builtin/math/?split=test").content.decode()
    assert 'class="board-row"' not in board
    sid = finished_run["episodes"][0]["sid"]
    assert client.get(f"/analytics/{outsider.team.slug}/sessions/{sid}/").status_code == 404


def test_the_agents_page_adds_pings_and_removes_agents(owner, member, agents):
    client = login(owner)
    r = client.post(f"/aap/{owner.team.slug}/agents/", {"name": "mine", "url": agents.url, "agent": "solver",
                                                         "api_key": AGENT_KEY, "stream": "delta"})
    assert r.status_code == 302
    agent = Agent.objects.get(team=owner.team, name="mine")
    html = client.get(f"/aap/{owner.team.slug}/agents/").content.decode()
    assert 'data-agent="mine"' in html and AGENT_KEY not in html
    r = client.post(f"/aap/{owner.team.slug}/agents/{agent.id}/ping", follow=True)
    assert "answered /meta: version 1.0.0, AAP version 1." in r.content.decode()
    bad = client.post(f"/aap/{owner.team.slug}/agents/", {"name": "v4", "url": f"{agents.url}/v4", "agent": "solver",
                                                          "stream": "none"})
    assert bad.status_code == 400 and "speaks AAP version 4; the platform speaks versions 1, 2, 3" in bad.content.decode()
    # Members see agents and may ping them; owners and admins add and remove them.
    assert login(member).post(f"/aap/{owner.team.slug}/agents/{agent.id}/remove").status_code == 403
    client.post(f"/aap/{owner.team.slug}/agents/{agent.id}/remove")
    assert 'data-agent="mine"' not in client.get(f"/aap/{owner.team.slug}/agents/").content.decode()


def test_a_run_is_launched_and_cancelled_from_the_runs_page(owner, agents):
    agent = register(owner, agents, "solver", "none")
    client = login(owner)
    r = client.post(f"/aap/{owner.team.slug}/", {"agent": agent["id"], "environment": "builtin/math",
                                                  "split": "test", "start": 0, "stop": 200, "concurrency": 1,
                                                  "max_turns": 3})
    assert r.status_code == 302
    run_id = int(r["Location"].rstrip("/").rsplit("/", 1)[1])
    client.post(f"/aap/{owner.team.slug}/runs/{run_id}/cancel")
    run = wait_run(owner, run_id, until=lambda run: run["status"] == "cancelled" and run["running"] == 0)
    assert run["done"] < 200
    bad = client.post(f"/aap/{owner.team.slug}/", {"agent": agent["id"], "environment": "builtin/nope",
                                                    "split": "test", "start": 0, "stop": 2, "concurrency": 1,
                                                    "max_turns": 3})
    assert bad.status_code == 400 and "not found" in bad.content.decode()
