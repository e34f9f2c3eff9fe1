"""A team's retention of tool calls: the REST endpoint (GET/PUT /api/v1/retention), the command,
and the team page; each team reaches only its own policy."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.test import Client

from orsplatform.auditlog import archive
from orsplatform.auditlog.models import RetentionPolicy
from orsplatform.auditlog.selectors import calls_of_sessions
from orsplatform.episodes.models import Session


def api(method: str, person=None, body=None):
    headers = {"HTTP_X_API_KEY": person.token} if person is not None else {}
    client = Client()
    if method == "GET":
        return client.get("/api/v1/retention", **headers)
    return client.put("/api/v1/retention", data=json.dumps(body), content_type="application/json", **headers)


def test_a_team_reads_and_changes_its_own_retention_and_no_other(owner, member, outsider, settings):
    settings.ORS_AUDIT_RETENTION_DAYS = 90
    first = api("GET", owner)
    assert first.status_code == 200
    assert first.json() == {"hot_days": 90, "platform_default": True, "archived_days": 0, "archived_rows": 0,
                            "archived_bytes": 0}

    changed = api("PUT", owner, {"hot_days": 30})
    assert changed.status_code == 200 and changed.json()["hot_days"] == 30
    assert not changed.json()["platform_default"]
    assert api("GET", member).json()["hot_days"] == 30  # the team's policy, read with a sessions key

    # The outsider's key reaches its own team only: its policy is its own, and changing it leaves acme's.
    assert api("GET", outsider).json()["hot_days"] == 90
    assert api("PUT", outsider, {"hot_days": 7}).json()["hot_days"] == 7
    assert api("GET", owner).json()["hot_days"] == 30
    assert RetentionPolicy.objects.get(team=owner.team).hot_days == 30

    assert api("PUT", owner, {"hot_days": None}).json() == first.json()  # back to the platform's default
    assert not RetentionPolicy.objects.filter(team=owner.team).exists()


def test_changing_retention_needs_the_manage_scope_and_a_key(owner, member):
    refused = api("PUT", member, {"hot_days": 1})  # a sessions-only key
    assert refused.status_code == 403 and set(refused.json()) == {"detail"}
    assert api("GET").status_code == 401 and api("PUT", None, {"hot_days": 1}).status_code == 401
    assert not RetentionPolicy.objects.filter(team=owner.team).exists()


@pytest.mark.parametrize("body", [{"hot_days": 0}, {"hot_days": -3}, {"hot_days": 10**9}, {"hot_days": "x"},
                                  {"hot_days": 1.5}, {}, [], {"hot_days": True}])
def test_a_retention_that_is_not_a_number_of_days_is_a_400_that_says_why(owner, body):
    response = api("PUT", owner, body)
    assert response.status_code == 400
    assert set(response.json()) == {"detail"} and response.json()["detail"]
    assert not RetentionPolicy.objects.filter(team=owner.team).exists()


def test_the_command_shows_and_sets_a_teams_retention(owner, capsys):
    call_command("audit_retention", "set", owner.team.slug, "14")
    assert "14 days in the database (its own policy)" in capsys.readouterr().out
    call_command("audit_retention", "set", owner.team.slug, "default")
    call_command("audit_retention", "show", owner.team.slug)
    assert "(the platform's default)" in capsys.readouterr().out


def test_the_embedded_default_keeps_one_table_and_retention_moves_nothing_there(owner):
    """SQLite (the embedded default) has no partitions: the archive run is a no-op and calls are
    read from the table as before. On PostgreSQL nothing of the test database is past retention."""
    report = archive.archive_run()
    assert report.archived == [] and report.dropped_partitions == [] and report.deleted == []
    assert calls_of_sessions(list(Session.objects.filter(team=owner.team))) == {}


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_team_page_shows_the_teams_retention(owner, outsider):
    from django.contrib.auth import get_user_model

    from orsplatform.auditlog.services import retention_set

    retention_set(team=owner.team, hot_days=21)
    page = _login(get_user_model().objects.get(username=owner.username)).get("/console/acme/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "<strong>21 days</strong>" in text and "(this team's policy)" in text
    other = _login(get_user_model().objects.get(username=outsider.username)).get("/console/globex/").content.decode()
    assert "(the platform's default)" in other and "21 days" not in other


def test_the_storage_page_is_for_operators_and_shows_tables_teams_and_partitions(owner, outsider):
    from django.contrib.auth import get_user_model
    from django.db import connection

    assert _login(get_user_model().objects.get(username=owner.username)).get("/console/storage").status_code == 403
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    page = _login(admin).get("/console/storage")
    assert page.status_code == 200
    text = page.content.decode()
    if connection.vendor == "postgresql":
        assert "<code>episodes_toolcall</code>" in text and "episodes_toolcall_default" in text
    else:
        assert "this database is SQLite" in text
