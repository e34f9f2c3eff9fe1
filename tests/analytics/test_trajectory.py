"""Replaying a session: prompt blocks (images rendered), each call's input, output, reward, finished
and latency — and never a secret."""

from __future__ import annotations

from orsplatform.episodes.models import Session
from orsplatform.episodes.services import session_record_prompt
from orsplatform.teams.models import ApiKey
from tests.analytics.conftest import login
from tests.analytics.seed import PNG_SQUARE


def test_the_first_prompt_is_recorded_and_later_ones_are_ignored(seeded):
    session = seeded.sessions[1]
    session_record_prompt(pk=session.pk, blocks=[{"type": "text", "text": "first"}])
    session_record_prompt(pk=session.pk, blocks=[{"type": "text", "text": "second"}])
    assert Session.objects.get(pk=session.pk).prompt == [{"type": "text", "text": "first"}]


def test_the_trajectory_page_replays_prompt_and_calls(seeded, owner):
    response = login(owner).get("/analytics/acme/sessions/acme-puzzle-0/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Solve puzzle 0" in page
    assert f'src="data:image/png;base64,{PNG_SQUARE}"' in page
    assert page.count('class="call card"') == 5
    assert "result 3" in page and "&quot;step&quot;: 4" in page  # output blocks and inputs
    assert "latency 5 ms" in page and 'class="call-reward">0<' in page and "finished <strong>yes</strong>" in page
    assert "task 0 of train" in page  # the task spec
    assert page.count('<svg class="chart"') == 1 and 'data-empty="false"' in page


def test_errors_of_calls_are_shown(seeded, owner):
    page = login(owner).get("/analytics/acme/sessions/acme-puzzle-1/").content.decode()
    assert 'class="bad call-error">Invalid move' in page and "tool_error" in page


def test_a_session_without_a_recorded_prompt_says_so(seeded, owner):
    page = login(owner).get("/analytics/acme/sessions/acme-puzzle-2/").content.decode()
    assert 'id="no-prompt"' in page


def test_images_of_unsafe_types_are_not_rendered(seeded, owner):
    svg = "PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+"  # <svg onload=alert(1)>
    Session.objects.filter(sid="acme-puzzle-3").update(prompt=[
        {"type": "image", "mimeType": "image/svg+xml", "data": svg},
        {"type": "image", "mimeType": "image/png", "data": 'x" onerror="alert(1)'},
    ])
    page = login(owner).get("/analytics/acme/sessions/acme-puzzle-3/").content.decode()
    assert "data:image/svg" not in page and "onerror" not in page
    assert page.count("unsupported type omitted") == 2


def test_no_secret_is_ever_shown(seeded, owner):
    key = ApiKey.objects.get(team=owner.team)
    client = login(owner)
    for url in ("/analytics/acme/", "/analytics/acme/sessions/", "/analytics/acme/sessions/acme-puzzle-0/",
                "/api/v1/analytics/sessions/acme-puzzle-0"):
        response = client.get(url, HTTP_X_API_KEY=owner.token)
        text = response.content.decode()
        assert response.status_code == 200
        assert owner.token not in text and owner.token.split("_")[2] not in text and key.secret_hash not in text
    exported = b"".join(client.get("/analytics/acme/export.jsonl").streaming_content).decode()
    assert owner.token.split("_")[2] not in exported and key.secret_hash not in exported


def test_an_open_sessions_totals_come_from_its_calls(seeded, owner):
    page = login(owner).get("/analytics/acme/sessions/acme-open-0/").content.decode()
    assert 'id="total-reward">1.5<' in page and "open" in page
