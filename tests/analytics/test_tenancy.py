"""Team B (the outsider, globex) sees none of team A's (acme's) sessions on any page, API endpoint or
export, and A sees none of B's."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.analytics.conftest import login

ACME_PAGES = [
    "/analytics/acme/",
    "/analytics/acme/environments/acme/puzzle/",
    "/analytics/acme/environments/builtin/math/",
    "/analytics/acme/sessions/",
    "/analytics/acme/sessions/acme-puzzle-0/",
    "/analytics/acme/export.jsonl",
    "/analytics/acme/export.parquet",
]


def body(response) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode(errors="replace")
    return response.content.decode()


def test_pages_require_login(seeded):
    for url in ACME_PAGES:
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url


@pytest.mark.parametrize("url", ACME_PAGES)
def test_an_outsider_gets_a_404_for_every_page_of_another_team(seeded, outsider, url):
    assert login(outsider).get(url).status_code == 404


def test_an_outsiders_own_pages_show_none_of_the_other_teams_data(seeded, outsider):
    client = login(outsider)
    pages = [
        "/analytics/globex/", "/analytics/globex/sessions/", "/analytics/globex/environments/builtin/math/",
        "/analytics/globex/sessions/globex-private-0/", "/analytics/globex/export.jsonl",
        "/analytics/globex/sessions/?range=all&status=deleted",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        text = body(response)
        assert "acme-" not in text and "acme/puzzle" not in text and "alice" not in text, url
    exported = [json.loads(line) for line in body(client.get("/analytics/globex/export.jsonl")).splitlines()]
    assert [r["sid"] for r in exported] == ["globex-private-0"]
    # Another team's private environment is a 404 even on the outsider's own analytics, like a missing one.
    assert client.get("/analytics/globex/environments/acme/puzzle/").status_code == 404
    assert client.get("/analytics/globex/environments/acme/no-such-env/").status_code == 404
    # A's session ids and environments are unknown ids to B's filters and trajectory pages.
    assert client.get("/analytics/globex/sessions/acme-puzzle-0/").status_code == 404
    filtered = client.get("/analytics/globex/sessions/?environment=acme/puzzle")
    assert filtered.status_code == 400 and "Unknown environment" in filtered.content.decode()
    own_key = client.get("/analytics/globex/sessions/?api_key=" + seeded.sessions[0].api_key.prefix)
    assert own_key.status_code == 400 and "Unknown API key" in own_key.content.decode()


def test_the_other_team_sees_none_of_the_outsiders_data_either(seeded, owner):
    client = login(owner)
    for url in ("/analytics/acme/", "/analytics/acme/sessions/?range=all", "/analytics/acme/export.jsonl",
                "/analytics/acme/environments/builtin/math/"):
        assert "globex" not in body(client.get(url)), url
    assert client.get("/analytics/acme/sessions/globex-private-0/").status_code == 404
    math = client.get("/api/v1/analytics/environments/builtin/math", HTTP_X_API_KEY=owner.token).json()
    # acme's one open session on the public environment, not globex's ended one.
    assert math["totals"]["sessions"] == 1 and math["totals"]["scored_episodes"] == 0


def test_the_api_serves_only_the_calling_keys_team(seeded, outsider):
    headers = {"HTTP_X_API_KEY": outsider.token}
    client = Client()
    overview = client.get("/api/v1/analytics/overview", **headers).json()
    assert overview["totals"]["sessions"] == 1 and overview["totals"]["tool_calls"] == 1
    assert [e["environment"] for e in overview["top_environments"]] == ["builtin/math"]
    assert [r["sid"] for r in client.get("/api/v1/analytics/sessions?range=all", **headers).json()["sessions"]] == [
        "globex-private-0"]
    assert client.get("/api/v1/analytics/sessions/acme-puzzle-0", **headers).status_code == 404
    assert client.get("/api/v1/analytics/environments/acme/puzzle", **headers).status_code == 404
    exported = b"".join(client.get("/api/v1/analytics/export.jsonl?range=all", **headers).streaming_content)
    assert b"acme" not in exported and b"globex-private-0" in exported
    assert client.get("/api/v1/analytics/export.jsonl?environment=acme/puzzle", **headers).status_code == 400


def test_a_key_without_the_sessions_scope_reads_no_analytics(seeded, owner):
    from orsplatform.teams.services import api_key_create

    publish_only = api_key_create(team=owner.team, name="ci", scopes=["publish"]).token
    for url in ("/api/v1/analytics/overview", "/api/v1/analytics/sessions", "/api/v1/analytics/export.jsonl"):
        assert Client().get(url, HTTP_X_API_KEY=publish_only).status_code == 403


def test_a_superuser_may_look_at_any_team(seeded):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    assert client.get("/analytics/acme/").status_code == 200
    assert client.get("/analytics/").status_code == 200  # several teams: the chooser
