"""The run page tells the truth (issue 26 item 5): episodes that scored nothing are counted apart
from faults, every episode is listed with its trajectory, a chart follows the run while it goes on,
and evaluations are in the site's navigation."""

from __future__ import annotations

import re

import pytest

from orsplatform.evals.models import EvalEpisode
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import launch, register, wait_run
from tests.evals.test_pages import login

TASKS = 12


@pytest.fixture
def solved(owner, agents):
    """The solver on the math test split: it answers some tasks wrongly (reward 0, no fault)."""
    agent = register(owner, agents, "solver", "none")
    return wait_run(owner, launch(owner, agent["id"], stop=TASKS)["id"])


def count(html: str, name: str) -> int:
    return int(re.search(rf'id="count-{name}">(\d+)<', html).group(1))


def test_zero_reward_episodes_are_counted_apart_from_faults(owner, solved):
    zero = sum(1 for i in range(TASKS) if expected_reward("test", i) == 0)
    assert 0 < zero < TASKS, "the known outcomes need both passes and misses"
    html = login(owner).get(f"/aap/{owner.team.slug}/runs/{solved['id']}/").content.decode()
    assert count(html, "passed") == TASKS - zero and count(html, "zero") == zero
    assert count(html, "faults") == 0 and count(html, "partial") == 0
    failed = html.split('id="failed"', 1)[1].split("</table>", 1)[0]
    assert "None." in failed  # no fault, and the note beside it says where the zero scores are
    assert "scored nothing" in html


def test_a_fault_is_a_fault_not_a_zero(owner, agents):
    looper = register(owner, agents, "looper", "none")
    run = wait_run(owner, launch(owner, looper["id"], stop=2, max_turns=2)["id"])
    html = login(owner).get(f"/aap/{owner.team.slug}/runs/{run['id']}/").content.decode()
    assert count(html, "faults") == 2 and count(html, "zero") == 0
    assert html.count('<tr class="episode-row" data-outcome="fault">') == 2


def test_every_episode_is_listed_with_a_link_to_its_trajectory(owner, solved):
    client = login(owner)
    html = client.get(f"/aap/{owner.team.slug}/runs/{solved['id']}/").content.decode()
    assert html.count('class="episode-row"') == TASKS
    for episode in solved["episodes"]:
        assert f'href="/analytics/{owner.team.slug}/sessions/{episode["sid"]}/" class="episode-link"' in html
    zero = client.get(f"/aap/{owner.team.slug}/runs/{solved['id']}/?outcome=zero").content.decode()
    assert zero.count('class="episode-row"') == sum(1 for i in range(TASKS) if expected_reward("test", i) == 0)
    # A filter or page number no run has is the whole list or its last page, never an error.
    for query in ("?outcome=%3Cscript%3E", "?page=99999", "?page=-1", "?page=x"):
        r = client.get(f"/aap/{owner.team.slug}/runs/{solved['id']}/{query}")
        assert r.status_code == 200 and r.content.decode().count('class="episode-row"') == TASKS, query


def test_episodes_are_paged_and_the_pages_together_list_them_all(owner, solved, monkeypatch):
    from orsplatform.evals import selectors

    monkeypatch.setattr(selectors, "EPISODES_PER_PAGE", 5)
    client = login(owner)
    seen = []
    for page in (1, 2, 3):
        html = client.get(f"/aap/{owner.team.slug}/runs/{solved['id']}/?page={page}").content.decode()
        seen += re.findall(r'<tr class="episode-row" data-outcome="\w+"><td>#(\d+)<', html)
    assert sorted(map(int, seen)) == list(range(TASKS))
    assert "page 3 of 3" in html and 'id="episodes-prev"' in html and 'id="episodes-next"' not in html


def test_the_progress_chart_follows_the_episodes_as_they_end(owner, solved):
    html = login(owner).get(f"/aap/{owner.team.slug}/runs/{solved['id']}/").content.decode()
    chart = html.split('data-chart="run-progress"', 1)[1].split("</svg>", 1)[0]
    assert 'data-empty="false"' in chart and chart.count('class="mark"') == 2 * TASKS
    passed = sum(expected_reward("test", i) for i in range(TASKS))
    last = re.findall(r'data-value="([\d.]+)"', chart)[TASKS - 1]  # the "so far" series ends at the run's rate
    assert float(last) == pytest.approx(passed / TASKS * 100)
    assert 'data-live="false"' in html  # the run ended: nothing to refresh


def test_a_running_run_marks_its_chart_live(owner, agents):
    agent = register(owner, agents, "solver", "none")
    run = launch(owner, agent["id"], stop=200, concurrency=1)
    html = login(owner).get(f"/aap/{owner.team.slug}/runs/{run['id']}/").content.decode()
    assert 'data-live="true"' in html and 'id="live-badge"' in html
    login(owner).post(f"/aap/{owner.team.slug}/runs/{run['id']}/cancel")
    wait_run(owner, run["id"], until=lambda r: r["status"] == "cancelled" and r["running"] == 0)
    assert EvalEpisode.objects.filter(run_id=run["id"], status=EvalEpisode.Status.SCORED).count() < 200


def test_evaluations_are_in_the_site_navigation(owner, member, outsider):
    for person in (owner, member, outsider):
        html = login(person).get(f"/analytics/{person.team.slug}/").content.decode()
        assert '<a href="/aap/" id="nav-evaluations">Evaluations</a>' in html, person.username
