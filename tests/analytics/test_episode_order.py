"""Charts fall back to episode order when the episodes crowd into too few time buckets: 200 episodes
inside a minute draw a line, not a dot."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from orsplatform.analytics import order, selectors
from orsplatform.analytics.filters import parse_window
from orsplatform.episodes.models import Session
from tests.analytics.conftest import login
from tests.analytics.seed import make_environment


@pytest.fixture
def burst(owner):
    """200 ended episodes started within 40 seconds: rewards 0 for the first half, 1 for the second."""
    env, (version,) = make_environment(owner.team, "burst", versions=1)
    start = timezone.now().replace(second=5, microsecond=0) - timedelta(minutes=2)
    Session.objects.bulk_create([
        Session(sid=f"burst-{i}", team=owner.team, environment=env, version=version, task_spec={"i": i},
                split="train", task_index=i, status="deleted", created_at=start + timedelta(milliseconds=200 * i),
                last_activity_at=start + timedelta(seconds=50), ended_at=start + timedelta(seconds=50), calls=3,
                total_reward=0.0 if i < 100 else 1.0, finished=True)
        for i in range(200)])
    return env


def test_two_hundred_episodes_inside_a_minute_are_grouped_by_episode_order(burst, owner):
    data = selectors.environment_report(team=owner.team, environment=burst, version=None, window=parse_window({}))
    assert sum(1 for p in data["per_period"] if p["episodes"]) <= 2
    groups = data["per_episode"]
    assert len(groups) == order.ORDER_POINTS and sum(g["episodes"] for g in groups) == 200
    assert groups[0]["first"] == 1 and groups[-1]["last"] == 200
    assert [g["mean_reward"] for g in groups] == [0.0] * 50 + [1.0] * 50
    assert groups[0]["success_rate"] == 0 and groups[-1]["success_rate"] == 1


def test_the_environment_page_draws_the_burst_as_a_line_against_episode_order(burst, owner):
    page = login(owner).get("/analytics/acme/environments/acme/burst/").content.decode()
    charts = dict(re.findall(r'<figure class="chart-card" data-chart="([\w-]+)">.*?(<svg.*?</svg>)', page, re.S))
    for name in ("mean-reward", "success-rate"):
        svg = charts[name]
        assert svg.count('class="mark"') == 100 and "<polyline" in svg, name
        assert "Episode (in the order started), up to 2 per point" in svg
    assert "by episode order" in page


def test_episodes_spread_over_time_keep_the_time_axis(seeded, owner):
    data = selectors.environment_report(team=owner.team, environment=seeded.puzzle, version=None,
                                        window=parse_window({}))
    assert data["per_episode"] == [] and sum(1 for p in data["per_period"] if p["episodes"]) >= 3


def test_smoothing_keeps_gaps_and_does_not_pull_the_start_towards_zero():
    assert order.smooth([1.0, None, 1.0], 0.9) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    raw = [0.0, 1.0, 0.0, 1.0]
    assert order.smooth(raw, 0) == raw
    smoothed = order.smooth(raw, 0.6)
    assert smoothed[0] == 0.0 and 0 < smoothed[-1] < 1 and max(smoothed) < 1
