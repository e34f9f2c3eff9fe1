import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.teams.auth import verify_token
from orsplatform.teams.models import ApiKey


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


def test_pages_require_login(live_db):
    response = Client().get("/console/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_login_page_renders(live_db):
    assert Client().get("/accounts/login/").status_code == 200


def test_an_owner_creates_a_key_that_is_shown_once_and_works(owner):
    client = login(owner)
    response = client.post("/console/acme/", {"name": "ci", "scopes": ["sessions"], "expires_in_days": "30"})
    assert response.status_code == 200
    token = re.search(r'id="new-token">(ors_[0-9a-f]{8}_[0-9a-f]{32})<', response.content.decode()).group(1)
    caller, expires_at = verify_token(token)
    assert caller.team_id == owner.team.id and expires_at is not None
    again = client.get("/console/acme/").content.decode()
    assert token not in again and token.split("_")[1] in again  # only the prefix is ever shown again


def test_an_owner_revokes_a_key(owner):
    client = login(owner)
    key = ApiKey.objects.filter(team=owner.team).first()
    response = client.post(f"/console/acme/keys/{key.prefix}/revoke")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_a_member_sees_the_team_but_cannot_manage_keys(owner, member):
    client = login(member)
    page = client.get("/console/acme/")
    assert page.status_code == 200 and "alice" in page.content.decode() and "Create a key" not in page.content.decode()
    assert client.post("/console/acme/", {"name": "x", "scopes": ["sessions"]}).status_code == 403
    key = ApiKey.objects.filter(team=owner.team).first()
    assert client.post(f"/console/acme/keys/{key.prefix}/revoke").status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None


def test_an_outsider_cannot_see_or_touch_another_team(owner, outsider):
    client = login(outsider)
    assert client.get("/console/acme/").status_code == 404
    assert client.post("/console/acme/", {"name": "x", "scopes": ["sessions"]}).status_code == 404
    key = ApiKey.objects.filter(team=owner.team).first()
    assert client.post(f"/console/acme/keys/{key.prefix}/revoke").status_code == 404
    listing = client.get("/console/").content.decode()
    assert "acme" not in listing
    assert ApiKey.objects.filter(team=owner.team, revoked_at__isnull=False).count() == 0


def test_a_superuser_sees_every_team(owner, outsider):
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(admin)
    listing = client.get("/console/").content.decode()
    assert "acme" in listing and "globex" in listing
    assert client.get("/console/globex/").status_code == 200


@pytest.mark.parametrize("payload", [{"name": ""}, {"name": "x", "scopes": ["root"]}, {"name": "x", "expires_in_days": "-4"}])
def test_a_bad_key_form_shows_errors_and_creates_nothing(owner, payload):
    before = ApiKey.objects.count()
    response = login(owner).post("/console/acme/", payload)
    assert response.status_code == 200 and "errorlist" in response.content.decode()
    assert ApiKey.objects.count() == before


def test_the_key_list_is_paginated(owner):
    from orsplatform.teams.services import api_key_create

    for i in range(30):
        api_key_create(team=owner.team, name=f"bulk-{i:02d}")
    client = login(owner)
    first = client.get("/console/acme/").content.decode()
    second = client.get("/console/acme/?page=2").content.decode()
    assert "Page 1 of 2" in first and "Page 2 of 2" in second
    assert first.count("<code>ors_") + second.count("<code>ors_") == 31  # 30 and the fixture's own key


def test_a_second_key_with_a_taken_name_is_a_form_error_beside_the_name(owner):
    client = login(owner)
    assert client.post("/console/acme/", {"name": "ci", "scopes": ["sessions"]}).status_code == 200
    before = ApiKey.objects.filter(team=owner.team).count()
    response = client.post("/console/acme/", {"name": "CI", "scopes": ["sessions"]})
    html = response.content.decode()
    assert response.status_code == 200 and 'id="new-token"' not in html
    assert "already has a key named" in html and "errorlist" in html
    assert ApiKey.objects.filter(team=owner.team).count() == before


def test_the_one_time_key_has_a_copy_button_for_it(owner):
    html = login(owner).post("/console/acme/", {"name": "ci", "scopes": ["sessions"]}).content.decode()
    assert 'data-copy="new-token"' in html and 'id="copy-token"' in html


def test_another_team_may_use_a_name_this_team_uses(owner, outsider):
    login(owner).post("/console/acme/", {"name": "shared-name", "scopes": ["sessions"]})
    response = login(outsider).post(f"/console/{outsider.team.slug}/", {"name": "shared-name", "scopes": ["sessions"]})
    assert 'id="new-token"' in response.content.decode()
