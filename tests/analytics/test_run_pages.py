"""The run pages on a dataset with known curves (runs_seed.py): the runs list, one run and two runs
overlaid against step, curves per split and version, filters, smoothing, the links from a point to
its trajectories, a rollout's trajectory, bad input and tenancy."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import unquote

import pytest

from tests.analytics.conftest import login
from tests.analytics.runs_seed import STEPS, rewards_a, seed_runs

RUNS = "/analytics/acme/runs/"
VIEW = "/analytics/acme/runs/view/"


@pytest.fixture
def runs_data(owner, outsider):
    return seed_runs(acme=owner.team, globex=outsider.team)


def chart(html: str, name: str) -> str:
    return html.split(f'data-chart="{name}"', 1)[1].split("</svg>", 1)[0]


def marks(svg: str, curve: int | None = None) -> list[tuple[float, float]]:
    """(x, value) of every mark (of one curve)."""
    found = re.findall(r'<circle class="mark"[^>]*data-value="([^"]+)" data-x="([^"]+)" data-curve="(\d+)"', svg)
    return [(float(x), float(v)) for v, x, c in found if curve is None or int(c) == curve]


def test_the_runs_list_shows_the_teams_runs_with_their_counts(runs_data, owner, member):
    for person in (owner, member):
        html = login(person).get(RUNS).content.decode()
        rows = re.findall(r'class="run-link">([^<]+)</a>', html)
        assert sorted(rows) == ["grpo-a", "grpo-b", "keyed"]
    row = html.split('class="run-link">grpo-a</a>', 1)[1].split("</tr>", 1)[0]
    # 40 rollouts, 1 session (linked to the first rollout), 3 * 36 + 5 * 4 messages.
    assert re.findall(r'<td class="n">([^<]+)</td>', row)[:3] == ["40", "1", "128"]


def test_one_run_draws_reward_pass_rate_length_and_errors_against_step(runs_data, owner):
    html = login(owner).get(VIEW + "?run=grpo-a").content.decode()
    reward = marks(chart(html, "run-reward"))
    assert [x for x, _ in reward] == list(range(STEPS))
    for step, value in reward:
        assert value == pytest.approx(sum(rewards_a(int(step))) / 4)
    passes = dict(marks(chart(html, "run-pass-rate")))
    assert passes == {0: 25.0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 25.0, 6: 25.0, 7: 25.0, 8: 25.0, 9: 75.0}
    assert dict(marks(chart(html, "run-length")))[9] == 5 and dict(marks(chart(html, "run-length")))[0] == 3
    errors = dict(marks(chart(html, "run-errors")))
    assert errors[5] == 25.0 and sum(errors.values()) == 25.0
    assert "Training step (RunInfo / RolloutInfo step)" in chart(html, "run-reward")
    assert html.count('class="legend-item"') == 1


def test_two_runs_are_overlaid_on_one_step_axis(runs_data, owner):
    html = login(owner).get(VIEW + "?run=grpo-a&run=grpo-b").content.decode()
    for name in ("run-reward", "run-pass-rate", "run-length", "run-errors"):
        svg = chart(html, name)
        assert len(marks(svg, 0)) == STEPS and len(marks(svg, 1)) == STEPS, name
        assert svg.count('<polyline class="line" data-curve="0"') == 1 and 'data-curve="1" points=' in svg
    b = dict(marks(chart(html, "run-reward"), 1))
    assert b[0] == 0 and b[9] == pytest.approx(1.0) and b[3] == pytest.approx(3 / 9)
    assert re.findall(r'class="legend-item">.*?</svg> ([^<]+?) <', html) == ["grpo-a", "grpo-b"]


def test_curves_per_split_and_per_version_overlay_inside_one_run(runs_data, owner):
    client = login(owner)
    by_split = client.get(VIEW + "?run=grpo-b&per=split").content.decode()
    assert re.findall(r'class="legend-item">.*?</svg> ([^<]+?) <', by_split) == ["grpo-b · test", "grpo-b · train"]
    by_version = client.get(VIEW + "?run=grpo-b&per=version").content.decode()
    assert re.findall(r'class="legend-item">.*?</svg> ([^<]+?) <', by_version) == [
        "grpo-b · acme/puzzle@1", "grpo-b · acme/puzzle@2"]
    assert len(marks(chart(by_version, "run-reward"), 0)) == STEPS


def test_filters_narrow_the_curves_to_an_environment_version_and_split(runs_data, owner):
    client = login(owner)
    for query in ("split=test", "version=2", "environment=acme/puzzle&version=2&split=test"):
        html = client.get(VIEW + "?run=grpo-b&" + query).content.decode()
        assert len(marks(chart(html, "run-reward"))) == STEPS and "(10 episodes)" in html, query
    html = client.get(VIEW + "?run=grpo-b&split=nope").content.decode()
    assert 'data-empty="true"' in chart(html, "run-reward") and "No episodes match these filters." in html
    # The filter controls offer what the run used.
    assert '<option value="test"' in html and '<option value="acme/puzzle"' in html and '<option value="2"' in html


def test_smoothing_draws_the_line_through_smoothed_values_and_keeps_the_measured_dots(runs_data, owner):
    client = login(owner)
    raw = chart(client.get(VIEW + "?run=grpo-b").content.decode(), "run-reward")
    smoothed = chart(client.get(VIEW + "?run=grpo-b&smooth=0.9").content.decode(), "run-reward")
    assert marks(raw) == marks(smoothed)  # the dots are what was measured
    line = re.search(r'<polyline[^>]*points="([^"]+)"', smoothed).group(1)
    assert line != re.search(r'<polyline[^>]*points="([^"]+)"', raw).group(1)
    # The smoothed curve of a rising series ends below its last measured value.
    last_line_y = float(line.split()[-1].split(",")[1])
    last_mark_y = float(re.findall(r'<circle class="mark" cx="[^"]+" cy="([^"]+)"', smoothed)[-1])
    assert last_line_y > last_mark_y  # SVG y grows downwards


def test_each_point_links_to_its_trajectories(runs_data, owner):
    client = login(owner)
    html = client.get(VIEW + "?run=grpo-a").content.decode()
    links = [unescape(h) for h in re.findall(r'<a class="point-link" href="([^"]+)">', chart(html, "run-reward"))]
    assert len(links) == STEPS
    step_5 = next(link for link in links if "from=5&" in link)
    listing = client.get(step_5).content.decode()
    assert listing.count('class="episode-row"') == 4
    refs = re.findall(r'href="/analytics/acme/rollouts/([^/]+)/" class="trajectory-link"', listing)
    assert {r.event_id for r in runs_data.rollouts["grpo-a"][20:24]} == set(refs)
    # A point of a single episode opens its trajectory directly: the keyed run's sessions.
    keyed = client.get(VIEW + "?run=keyed").content.decode()
    single = re.findall(r'<a class="point-link" href="([^"]+)">', chart(keyed, "run-reward"))
    assert sorted(single) == ["/analytics/acme/sessions/acme-keyed-0/", "/analytics/acme/sessions/acme-keyed-1/"]
    assert "Episode (in the order started)" in chart(keyed, "run-reward")


def test_a_rollouts_trajectory_shows_the_models_messages_and_the_linked_sessions_tool_calls(runs_data, owner):
    rollout = runs_data.first_rollout
    html = login(owner).get(f"/analytics/acme/rollouts/{rollout.event_id}/").content.decode()
    assert html.count('class="card message message-') == 3 and f"message 0 of {rollout.name}" in html
    assert 'id="session-link"' in html and "acme-linked-0" in html
    assert html.count('class="call card"') == 2 and "tool result 1" in html
    assert 'href="/analytics/acme/runs/view/?run=grpo-a"' in html
    # A session's sid goes to the session's own page.
    r = login(owner).get("/analytics/acme/rollouts/acme-keyed-0/")
    assert r.status_code == 302 and r["Location"] == "/analytics/acme/sessions/acme-keyed-0/"


def test_bad_input_is_a_400_with_the_problem_spelled_out(runs_data, owner):
    client = login(owner)
    for query, words in (("", "Choose at least one run"), ("run=grpo-a&version=x", "Version must be"),
                         ("run=grpo-a&smooth=2", "Smoothing is a number"), ("run=grpo-a&per=nope", "Curves per"),
                         ("&".join(f"run=r{i}" for i in range(9)), "At most 8 runs"),
                         ("run=" + "x" * 201, "at most 200 characters")):
        r = client.get(VIEW + "?" + query)
        assert r.status_code == 400 and words in unescape(r.content.decode()), query
    assert client.get(VIEW + "?run=no-such-run").status_code == 404
    r = client.get("/analytics/acme/runs/episodes/?run=grpo-a&from=abc")
    assert r.status_code == 400 and "whole number" in unescape(r.content.decode())
    assert client.get("/analytics/acme/rollouts/no-such-ref/").status_code == 404
    assert client.get(RUNS + "?page=99999").status_code == 200


def test_another_team_sees_none_of_it(runs_data, owner, outsider):
    client = login(outsider)
    for url in (RUNS, VIEW + "?run=grpo-a", f"/analytics/acme/rollouts/{runs_data.first_rollout.event_id}/",
                "/analytics/acme/runs/episodes/?run=grpo-a"):
        assert client.get(url).status_code == 404, url
    # Its own run of the same name is its own: one rollout, none of acme's.
    own = client.get("/analytics/globex/runs/view/?run=grpo-a").content.decode()
    assert marks(chart(own, "run-reward")) == [(0.0, 1.0)]
    assert client.get(f"/analytics/globex/rollouts/{runs_data.first_rollout.event_id}/").status_code == 404
    listing = client.get("/analytics/globex/runs/episodes/?run=grpo-a").content.decode()
    assert listing.count('class="episode-row"') == 1
    assert "keyed" not in client.get("/analytics/globex/runs/").content.decode()


def test_runs_are_reachable_from_the_site_navigation(runs_data, owner):
    client = login(owner)
    html = client.get("/analytics/acme/").content.decode()
    assert '<a href="/analytics/?to=runs" id="site-nav-runs">Training runs</a>' in html
    assert 'id="nav-training-runs"' in html
    r = client.get("/analytics/?to=runs")
    assert r.status_code == 302 and unquote(r["Location"]) == RUNS


def test_a_session_only_run_without_its_row_has_a_page_and_an_empty_run_has_none(runs_data, owner):
    from orsplatform.episodes.models import Session
    from orsplatform.runs.models import Run

    Run.objects.filter(team=owner.team, name="keyed").delete()  # rows are written once per process
    client = login(owner)
    html = client.get(VIEW + "?run=keyed").content.decode()
    assert len(marks(chart(html, "run-reward"))) == 2
    assert client.get("/analytics/acme/runs/episodes/?run=keyed").content.decode().count('class="episode-row"') == 2
    Session.objects.filter(team=owner.team, run_name="keyed").update(run_name="elsewhere")
    Run.objects.create(team=owner.team, name="keyed", first_seen_at=runs_data.v1.created_at,
                       last_seen_at=runs_data.v1.created_at)
    assert client.get(VIEW + "?run=keyed").status_code == 404


def test_a_runs_flags_are_shown_on_its_page_with_links_to_their_episodes(runs_data, owner, outsider):
    from django.utils import timezone

    from orsplatform.flags.models import Flag

    now = timezone.now()
    Flag.objects.create(team=owner.team, kind=Flag.Kind.FAST_PASS, key="keyed-fast", environment=runs_data.puzzle,
                        run_name="keyed", summary="acme-keyed-0 passed in 1 call; the task's typical pass takes 9",
                        sessions=["acme-keyed-0"], first_seen_at=now, last_seen_at=now)
    html = login(owner).get(VIEW + "?run=keyed").content.decode()
    flags = html.split('<section class="flags">', 1)[1].split("</section>", 1)[0]
    assert "passed in 1 call" in flags and 'href="/analytics/acme/sessions/acme-keyed-0/"' in flags
    other = login(owner).get(VIEW + "?run=grpo-a").content.decode()
    assert "passed in 1 call" not in other and "No flags" in other
    assert "passed in 1 call" not in login(outsider).get("/analytics/globex/runs/view/?run=grpo-a").content.decode()
