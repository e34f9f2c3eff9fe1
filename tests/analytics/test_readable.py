"""Analytics that read well: tasks with their text and a way to their sessions, how each episode
ended, a sortable and searchable explorer, a time axis that fits the data, and one parser for the
pages and the REST API."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client

from orsplatform.analytics import charts, selectors
from orsplatform.analytics.filters import parse_window
from orsplatform.episodes.models import Session
from tests.analytics.conftest import login


def test_hardest_tasks_show_their_text_and_link_to_the_sessions_that_tried_them(seeded, owner):
    client = login(owner)
    page = client.get("/analytics/acme/environments/acme/puzzle/?range=all").content.decode()
    hardest = page[page.index('id="hardest-tasks"'):page.index("</table>", page.index('id="hardest-tasks"'))]
    assert "task 0 of train" in hardest and "task 1 of test" in hardest
    link = re.search(r'href="([^"]*task=0[^"]*)" class="task-sessions"', hardest).group(1).replace("&amp;", "&")
    assert "split=train" in link and "environment=acme%2Fpuzzle" in link
    sessions = client.get(link).content.decode()
    assert set(re.findall(r"<code>(acme-puzzle-\d+)</code>", sessions)) == {"acme-puzzle-0", "acme-puzzle-5"}


def test_ended_episodes_say_how_they_ended(seeded, owner):
    Session.objects.filter(sid="acme-puzzle-1").update(finished=False)
    Session.objects.filter(sid="acme-puzzle-2").update(status="expired", finished=False)
    Session.objects.filter(sid="acme-puzzle-3").update(status="lost", finished=False)
    client = login(owner)
    page = client.get("/analytics/acme/sessions/?range=all").content.decode()
    outcomes = re.findall(r'class="status status-(\w+)"', page)
    assert sorted(set(outcomes)) == ["abandoned", "expired", "finished", "lost", "running"]
    assert "deleted</span>" not in page
    only = client.get("/analytics/acme/sessions/?range=all&outcome=abandoned").content.decode()
    assert only.count('class="session-link"') == 1 and "acme-puzzle-1" in only
    api = Client().get("/api/v1/analytics/sessions?range=all&outcome=lost", HTTP_X_API_KEY=owner.token).json()
    assert [s["sid"] for s in api["sessions"]] == ["acme-puzzle-3"] and api["sessions"][0]["outcome"] == "lost"
    detail = client.get("/analytics/acme/sessions/acme-puzzle-2/").content.decode()
    assert 'id="outcome">expired<' in detail


@pytest.mark.parametrize("column", ["session", "environment", "task", "api_key", "outcome", "started", "duration",
                                    "calls", "reward"])
def test_the_explorer_sorts_by_every_column_both_ways(seeded, owner, column):
    client = login(owner)
    for sort in (column, "-" + column):
        response = client.get(f"/analytics/acme/sessions/?range=all&sort={sort}")
        assert response.status_code == 200 and response.content.decode().count('class="session-link"') == 13


def test_the_explorer_sorts_rewards_in_order(seeded, owner):
    api = Client().get("/api/v1/analytics/sessions?range=all&sort=reward&environment=acme/puzzle&version=1",
                       HTTP_X_API_KEY=owner.token).json()
    rewards = [s["total_reward"] for s in api["sessions"]]
    assert rewards == sorted(rewards) and len(rewards) == 10
    page = login(owner).get("/analytics/acme/sessions/?range=all&sort=-calls").content.decode()
    assert page.index("acme-puzzle-9") < page.index("acme-puzzle-0")
    assert 'data-sort="calls">Calls ↓' in page


def test_the_explorer_searches_by_task_text(seeded, owner):
    client = login(owner)
    page = client.get("/analytics/acme/sessions/?range=all&q=task+1+of+test").content.decode()
    assert page.count('class="session-link"') == 1 and "acme-test-1" in page
    api = Client().get("/api/v1/analytics/sessions?range=all&q=OF+TRAIN", HTTP_X_API_KEY=owner.token).json()
    assert api["total"] == 11  # ten puzzle sessions and the open math one


@pytest.mark.parametrize(("params", "message"), [
    ({"sort": "nonsense"}, "Unknown sort"),
    ({"outcome": "exploded"}, "Unknown outcome"),
    ({"task": "-1"}, "is not a task index"),
])
def test_the_pages_and_the_api_refuse_the_same_bad_parameters_the_same_way(seeded, owner, params, message):
    from urllib.parse import urlencode

    page = login(owner).get("/analytics/acme/sessions/?" + urlencode(params))
    assert page.status_code == 400 and message in page.content.decode()
    api = Client().get("/api/v1/analytics/sessions?" + urlencode(params), HTTP_X_API_KEY=owner.token)
    assert api.status_code == 400 and message in api.json()["detail"]


def test_the_time_axis_fits_an_hour_of_data_in_minutes(owner, live_db):
    from tests.analytics.seed import seed

    data = seed(acme=owner.team)
    hour_ago = data.now - timedelta(hours=1)
    Session.objects.filter(team=owner.team).exclude(sid="acme-open-0").update(created_at=hour_ago)
    Session.objects.filter(sid="acme-open-0").update(status="deleted", ended_at=data.now)
    report = selectors.environment_report(team=owner.team, environment=data.puzzle, version=None,
                                          window=parse_window({"range": "7d"}))
    assert report["span"]["granularity"] == "minute"
    assert 12 <= len(report["per_period"]) <= 120


def test_time_labels_never_run_past_the_chart_and_the_last_point_is_labelled():
    from datetime import UTC, datetime

    times = [datetime(2026, 1, 1, 10, m, tzinfo=UTC) for m in range(0, 47)]
    svg = str(charts.time_series(times, [("Sessions", [1] * 47)], title="t", y_label="y", granularity="minute"))
    ticks = re.findall(r'<text class="tick x-tick" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)"[^>]*>([^<]*)<', svg)
    assert ticks[0][1] == "start" and ticks[-1][1] == "end" and ticks[-1][2] == "10:46"
    assert all(float(x) <= charts.WIDTH for x, _, _ in ticks)
    assert 'data-start="2026-01-01T10:46" data-end="2026-01-01T10:47"' in svg  # a point zooms to its minute


def test_a_page_with_a_run_in_progress_refreshes_itself(seeded, owner):
    client = login(owner)
    live = client.get("/analytics/acme/?range=all").content.decode()
    assert 'data-live="true"' in live and 'id="live-badge"' in live
    Session.objects.filter(status="ready").update(status="deleted", ended_at=seeded.now)
    still = client.get("/analytics/acme/?range=all").content.decode()
    assert 'data-live="false"' in still and 'id="live-badge"' not in still
    assert 'src="/static/hub/site.js"' in still


def test_a_short_run_draws_a_dozen_points_on_every_time_chart_and_counts_every_call(owner, live_db):
    from orsplatform.analytics.services import tool_call_rollup_run
    from tests.analytics.seed import seed

    data = seed(acme=owner.team)
    # A run of the last hour: sessions started 50 minutes ago, their calls 45 to 5 minutes ago.
    from django.db.models import F

    from orsplatform.episodes.models import ToolCall

    Session.objects.filter(team=owner.team).update(created_at=data.now - timedelta(minutes=50))
    Session.objects.filter(status="ready").update(status="deleted", ended_at=data.now)
    calls = list(ToolCall.objects.filter(session__team=owner.team).order_by("id").values_list("id", flat=True))
    for i, call_id in enumerate(calls):
        moment = data.now - timedelta(minutes=45) + timedelta(seconds=i * 20)
        ToolCall.objects.filter(id=call_id).update(started_at=moment, finished_at=moment + (F("finished_at") - F("started_at")))
    tool_call_rollup_run(settle=0)
    overview = selectors.overview(team=owner.team, window=parse_window({"range": "24h"}))
    assert overview["span"]["granularity"] == "minute" and len(overview["per_period"]) >= 12
    assert len(overview["calls_per_period"]) >= 12 and overview["calls_granularity"] == "hour"
    assert overview["totals"]["tool_calls"] == 104  # seed.py: 100 puzzle calls, 2 test, 2 of the open session
    environment = selectors.environment_report(team=owner.team, environment=data.puzzle, version=None,
                                               window=parse_window({"range": "24h"}))
    assert environment["span"]["granularity"] == "minute" and len(environment["per_period"]) >= 12
    assert sum(p["tool_calls"] for p in overview["calls_per_period"]) == 104
