"""The REST API under /api/: catalog and audit log, checked as owner, member, outsider, anonymous."""

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from orsplatform.catalog.models import Environment
from orsplatform.teams.services import api_key_create
from tests.fixtures.ors import sse_result, start_episode


def get(path: str, person=None, **headers):
    if person is not None:
        headers["HTTP_X_API_KEY"] = person.token
    return Client().get(path, **headers)


@pytest.fixture
def private_env(owner):
    builtin_math = Environment.objects.get(team__slug="builtin", slug="math")
    return Environment.objects.create(team=owner.team, slug="secret-maze", visibility="private",
                                      current_version=builtin_math.current_version)


@pytest.fixture
async def owners_session(client, owner):
    sid = await start_episode(client, owner.headers, split="train", index=2)
    r = await client.post("/math/call", headers={**owner.headers, "X-Session-ID": sid},
                          json={"name": "submit", "input": {"answer": "nope"}})
    assert sse_result(r.text)["ok"]
    return sid


def test_the_schema_and_docs_are_served_without_a_cdn(live_db):
    schema = Client().get("/api/schema/")
    assert schema.status_code == 200 and b"/api/v1/sessions" in schema.content
    docs = Client().get("/api/docs/").content.decode()
    assert "swagger" in docs.lower() and "cdn" not in docs.lower() and "https://" not in docs


def test_the_catalog_lists_public_and_own_environments_only(private_env, owner, member, outsider):
    assert "acme/secret-maze" in [e["name"] for e in get("/api/v1/environments", owner).json()]
    assert "acme/secret-maze" in [e["name"] for e in get("/api/v1/environments", member).json()]
    for who in (outsider, None):
        names = [e["name"] for e in get("/api/v1/environments", who).json()]
        assert "builtin/math" in names and "acme/secret-maze" not in names


def test_another_teams_private_environment_is_a_404_like_a_missing_one(private_env, owner, outsider):
    assert get("/api/v1/environments/acme/secret-maze", owner).status_code == 200
    hidden = get("/api/v1/environments/acme/secret-maze", outsider)
    missing = get("/api/v1/environments/acme/no-such-env", outsider)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json() == missing.json()


def test_environment_detail_shows_tools_splits_and_versions(live_db):
    body = get("/api/v1/environments/builtin/math").json()
    assert body["tools"][0]["name"] == "submit"
    assert {"name": "train", "type": "train", "num_tasks": 10000} in body["splits"]
    assert body["versions"][0]["number"] == body["current_version"]


async def test_sessions_and_their_audit_log_are_visible_to_the_team_only(owners_session, owner, member, outsider):
    sid = owners_session
    list_as = sync_to_async(lambda who: get("/api/v1/sessions", who))
    detail_as = sync_to_async(lambda who: get(f"/api/v1/sessions/{sid}", who))
    assert sid in [s["sid"] for s in (await list_as(owner)).json()]
    assert sid in [s["sid"] for s in (await list_as(member)).json()]
    assert sid not in [s["sid"] for s in (await list_as(outsider)).json()]
    detail = (await detail_as(owner)).json()
    assert detail["tool_calls"][0]["name"] == "submit" and detail["tool_calls"][0]["reward"] == 0.0
    assert (await detail_as(outsider)).status_code == 404
    anonymous = await detail_as(None)
    assert anonymous.status_code == 401 and "detail" in anonymous.json()


def test_a_key_without_the_sessions_scope_cannot_read_the_audit_log(owner):
    publish_only = api_key_create(team=owner.team, name="ci", scopes=["publish"]).token
    r = Client().get("/api/v1/sessions", HTTP_X_API_KEY=publish_only)
    assert r.status_code == 403 and "detail" in r.json()


@pytest.mark.parametrize("header", ["ors_nope", "Bearer", "ors_00000000_" + "0" * 32])
def test_bad_keys_are_401_with_a_detail(live_db, header):
    r = Client().get("/api/v1/environments", HTTP_X_API_KEY=header)
    assert r.status_code == 401 and isinstance(r.json()["detail"], str)


def test_bearer_authorization_works(owner):
    r = Client().get("/api/v1/sessions", HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    assert r.status_code == 200


@pytest.mark.parametrize("query", ["?status=bogus", "?limit=0", "?limit=100000", "?before_id=abc", "?limit=1;DROP TABLE x"])
def test_bad_filters_are_400_with_a_detail(owner, query):
    r = get(f"/api/v1/sessions{query}", owner)
    assert r.status_code == 400 and isinstance(r.json()["detail"], str)


def test_anonymous_catalog_reads_can_be_switched_off(live_db, settings):
    settings.ORS_ANONYMOUS_CATALOG = False
    assert get("/api/v1/environments").status_code == 401
