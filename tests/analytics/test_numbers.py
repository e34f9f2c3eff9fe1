"""The numbers of the analytics selectors, pages and API on a dataset with known answers (seed.py)."""

from __future__ import annotations

import math

import pytest
from django.test import Client

from orsplatform.analytics import latency, selectors
from orsplatform.analytics.filters import parse_window
from tests.analytics.conftest import login

PUZZLE = "acme/puzzle"


def report(seeded, owner, **params):
    version = params.pop("version", None)
    return selectors.environment_report(team=owner.team, environment=seeded.puzzle, version=version,
                                        window=parse_window(params))


def counts(histogram):
    return {(b["lo"], b["hi"]): b["count"] for b in histogram if b["count"]}


def test_the_reward_histogram_has_the_known_bins(seeded, owner):
    data = report(seeded, owner, version=seeded.v1)
    assert [b["count"] for b in data["reward_histogram"]] == [3, 0, 1, 0, 0, 2, 0, 0, 0, 4]
    assert data["reward_histogram"][0]["lo"] == 0 and data["reward_histogram"][-1]["hi"] == 1
    # Both versions: the test split adds a 1 and a 0.
    assert counts(report(seeded, owner)["reward_histogram"]) == {(0, 0.1): 4, (0.2, 0.3): 1, (0.5, 0.6): 2, (0.9, 1): 5}


def test_mean_reward_and_success_rate_use_scored_episodes(seeded, owner):
    totals = report(seeded, owner, version=seeded.v1)["totals"]
    assert totals["sessions"] == 10 and totals["scored_episodes"] == 10
    assert totals["mean_reward"] == pytest.approx(0.525)
    assert totals["success_rate"] == pytest.approx(0.4)
    both = report(seeded, owner)["totals"]
    assert both["mean_reward"] == pytest.approx(6.25 / 12) and both["success_rate"] == pytest.approx(5 / 12)


def test_pass_rates_per_split_and_the_hardest_and_easiest_tasks(seeded, owner):
    data = report(seeded, owner)
    splits = {s["split"]: s for s in data["splits"]}
    assert splits["train"]["episodes"] == 10 and splits["train"]["passed"] == 4
    assert splits["train"]["pass_rate"] == pytest.approx(0.4) and splits["train"]["mean_reward"] == pytest.approx(0.525)
    assert splits["test"]["pass_rate"] == pytest.approx(0.5)
    assert data["tasks_scored"] == 7
    assert [(t["split"], t["task_index"]) for t in data["hardest_tasks"]] == [
        ("test", 1), ("train", 0), ("train", 1), ("train", 2)]
    assert [(t["split"], t["task_index"]) for t in data["easiest_tasks"]] == [("test", 0), ("train", 4), ("train", 3)]
    train0 = data["hardest_tasks"][1]
    assert train0["attempts"] == 2 and train0["passed"] == 0 and train0["mean_reward"] == pytest.approx(0.25)


def test_latency_percentiles_are_the_known_values(seeded, owner):
    data = report(seeded, owner, version=seeded.v1)
    # Calls take 1, 2, …, 100 ms: nearest-rank p50 = 50, p95 = 95, p99 = 99.
    assert data["totals"]["latency"] == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    tools = {t["name"]: t for t in data["tools"]}
    assert tools["move"]["calls"] == 90 and tools["move"]["errors"] == 7
    assert tools["submit"]["calls"] == 10 and tools["submit"]["errors"] == 3 and tools["submit"]["p50"] == 36.0
    assert tools["submit"]["mean_latency_ms"] == pytest.approx(sum([5, 10, 18, 26, 36, 46, 58, 70, 85, 100]) / 10)
    series = [p for p in data["latency_per_period"] if p["calls"]]
    assert sum(p["calls"] for p in series) == 100
    # Above 100 ms the buckets are 2 % wide: the 200 ms calls of version 2 read back within 1 %.
    v2 = report(seeded, owner, version=seeded.v2)["totals"]["latency"]
    assert v2["p50"] == pytest.approx(200, rel=0.01)


def test_episode_lengths_are_counted_per_ended_episode(seeded, owner):
    hist = report(seeded, owner)["episode_length_histogram"]
    assert {b["lo"]: b["count"] for b in hist if b["count"]} == {1: 2, 5: 2, 8: 2, 10: 2, 12: 2, 15: 2}
    assert [b["lo"] for b in hist] == list(range(16))


def test_the_overview_counts_sessions_calls_errors_open_sessions_and_keys(seeded, owner):
    data = selectors.overview(team=owner.team, window=parse_window({}))
    totals = data["totals"]
    assert totals["sessions"] == 13 and totals["open_now"] == 1
    assert totals["tool_calls"] == 104 and totals["errors"] == 10
    assert totals["error_rate"] == pytest.approx(10 / 104)
    assert totals["success_rate"] == pytest.approx(5 / 12)
    assert sum(p["sessions"] for p in data["per_period"]) == 13
    assert sum(p["tool_calls"] for p in data["per_period"]) == 104
    assert [(e["environment"], e["sessions"], e["tool_calls"]) for e in data["top_environments"]] == [
        ("acme/puzzle", 12, 102), ("builtin/math", 1, 2)]
    keys = [k for k in data["api_keys"] if k["sessions"]]
    assert [(k["name"], k["sessions"], k["tool_calls"], k["errors"]) for k in keys] == [("alice-key", 13, 104, 10)]


def test_a_narrower_window_narrows_every_number(seeded, owner):
    start = (seeded.now - __import__("datetime").timedelta(hours=10)).strftime("%Y-%m-%dT%H:%M")
    data = selectors.overview(team=owner.team, window=parse_window({"start": start}))
    # Only the open session (5 minutes old) started in the last ten hours: the axis fits those
    # minutes (a point per minute, at least a dozen of them), not ten hours of empty buckets.
    assert data["totals"]["sessions"] == 1 and data["span"]["granularity"] == "minute"
    assert 12 <= len(data["per_period"]) <= 20 and sum(p["sessions"] for p in data["per_period"]) == 1
    assert data["calls_granularity"] == "hour"  # calls come from hourly rollups


def test_the_pages_show_the_known_numbers(seeded, owner):
    client = login(owner)
    overview = client.get("/analytics/acme/")
    assert overview.status_code == 200
    page = overview.content.decode()
    assert 'id="tile-sessions">13<' in page and 'id="tile-open">1<' in page and 'id="tile-calls">104<' in page
    assert "acme/puzzle" in page and "alice-key" in page and page.count('<svg class="chart"') == 2  # tables only for environments and keys
    env = client.get(f"/analytics/acme/environments/acme/puzzle/?version={seeded.v1.number}")
    assert env.status_code == 200
    page = env.content.decode()
    assert 'id="tile-success">40.0%<' in page and 'id="tile-latency">50 ms / 95 ms / 99 ms<' in page
    assert page.count('<svg class="chart"') == 5 and 'data-empty="true"' not in page  # tools, splits: tables only
    sessions = client.get("/analytics/acme/sessions/?environment=acme/puzzle&version=1")
    assert sessions.status_code == 200 and sessions.content.decode().count('class="session-link"') == 10


def test_the_api_serves_the_same_numbers_as_the_pages(seeded, owner):
    headers = {"HTTP_X_API_KEY": owner.token}
    overview = Client().get("/api/v1/analytics/overview", **headers)
    assert overview.status_code == 200
    assert overview.json()["totals"] == {
        **selectors.overview(team=owner.team, window=parse_window({}))["totals"], "mean_reward": pytest.approx(6.25 / 12)}
    env = Client().get("/api/v1/analytics/environments/acme/puzzle?version=1", **headers).json()
    assert env["totals"]["latency"] == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert [b["count"] for b in env["reward_histogram"]] == [3, 0, 1, 0, 0, 2, 0, 0, 0, 4]
    listing = Client().get("/api/v1/analytics/sessions?status=ready", **headers).json()
    assert listing["total"] == 1 and listing["sessions"][0]["sid"] == "acme-open-0"
    # An open session's totals come from its calls (the Session row is written when it ends).
    assert listing["sessions"][0]["calls"] == 2 and listing["sessions"][0]["total_reward"] == pytest.approx(1.5)
    detail = Client().get("/api/v1/analytics/sessions/acme-puzzle-0", **headers).json()
    assert [c["latency_ms"] for c in detail["tool_calls"]] == [1, 2, 3, 4, 5]
    assert detail["prompt"][0] == {"type": "text", "text": "Solve puzzle 0"}


def test_empty_data_renders_empty_charts_with_a_note(owner):
    client = login(owner)
    for url in ("/analytics/acme/", "/analytics/acme/environments/builtin/math/"):
        response = client.get(url)
        page = response.content.decode()
        assert response.status_code == 200
        assert 'data-empty="false"' not in page and "No data in this time range." in page
    sessions = client.get("/analytics/acme/sessions/")
    assert sessions.status_code == 200 and "No sessions match these filters." in sessions.content.decode()


def test_latency_buckets_are_exact_to_the_millisecond_below_100_ms_and_within_1_percent_above():
    for ms in range(0, 100):
        assert latency.bucket_value(latency.bucket_of(ms)) == ms
    for ms in (99.6, 100, 150, 999, 12_345.6, 3_600_000):
        assert latency.bucket_value(latency.bucket_of(ms)) == pytest.approx(ms, rel=0.01)
    hist = {latency.bucket_of(v): 1 for v in range(1, 101)}
    assert latency.percentiles(hist) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert latency.percentiles({}) == {"p50": None, "p95": None, "p99": None}
    assert math.isclose(latency.percentiles({latency.bucket_of(1000): 3})["p99"], 1000, rel_tol=0.01)
