"""`make run` keeps one development key: each run's key replaces the last one instead of adding another
full-scope key."""

from __future__ import annotations

import io

import httpx
from django.core.management import call_command

from orsplatform.teams.models import ApiKey
from orsplatform.teams.services import api_key_create, team_get_or_create_builtin


def dev_key() -> str:
    out = io.StringIO()
    call_command("dev_key", stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def active_dev_keys() -> list[ApiKey]:
    return list(ApiKey.objects.filter(team__slug="builtin", name="make run", revoked_at__isnull=True))


def test_two_runs_leave_one_active_dev_key_and_the_first_key_stops_working(live_db, server):
    first = dev_key()
    second = dev_key()
    assert first != second
    [active] = active_dev_keys()
    assert second.startswith(f"ors_{active.prefix}_")
    assert ApiKey.objects.filter(team__slug="builtin", name="make run").count() == 2  # the first, revoked
    old = httpx.post(f"{server.url}/create_session", headers={"X-API-Key": first}, timeout=30)
    new = httpx.post(f"{server.url}/create_session", headers={"X-API-Key": second}, timeout=30)
    assert old.status_code == 401 and new.status_code == 200, (old.text, new.text)


def test_a_key_someone_created_under_the_same_name_is_left_alone(live_db, django_user_model):
    team = team_get_or_create_builtin(slug="builtin")
    person = django_user_model.objects.create(username="carol")
    theirs = api_key_create(team=team, name="make run", created_by=person).api_key
    dev_key()
    dev_key()
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert active_dev_keys() == [theirs]  # names are unique among live keys: the dev key takes another
    unowned = ApiKey.objects.filter(team__slug="builtin", created_by__isnull=True, revoked_at__isnull=True)
    assert [k.name for k in unowned] == ["make run (unowned)"]  # one, the latest run's
