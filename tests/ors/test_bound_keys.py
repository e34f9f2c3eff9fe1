"""A key bound to one environment uses that one only on the ORS face: it is the key's default for
clients that name none, every other environment it names (builtin/math included) answers 403, and
so does a session of its team on another environment; when its environment is no longer visible to
it, nothing falls back to ORS_DEFAULT_ENVIRONMENT."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session
from orsplatform.teams.services import api_key_create
from tests.fixtures.ors import start_episode


@pytest.fixture
def own_math(owner) -> Environment:
    environment_publish(team=owner.team, source_dir=django_settings.ORS_ENVS_DIR / "math", slug="own-math",
                        visibility="private")
    return Environment.objects.get(team=owner.team, slug="own-math")


@pytest.fixture
def bound(owner, own_math) -> dict[str, str]:
    return {"X-API-Key": api_key_create(team=owner.team, name="bound", scopes=["sessions"], environment=own_math).token}


async def environment_of(sid: str) -> str:
    session = await sync_to_async(Session.objects.select_related("environment__team").get)(sid=sid)
    return session.environment.full_name


def refused(r) -> bool:
    return r.status_code == 403 and "bound to one environment" in r.json()["detail"]


async def test_a_bound_key_runs_its_environment_when_it_names_none(client, bound):
    sid = await start_episode(client, bound, env="", split="test", index=0)  # bare /create, no env_name
    assert await environment_of(sid) == "acme/own-math"
    prompt = await client.get("/prompt", headers={**bound, "X-Session-ID": sid})
    assert prompt.status_code == 200
    assert (await client.get("/list_environments", headers=bound)).json() == ["acme/own-math"]
    assert (await client.get("/acme/own-math/tools", headers=bound)).status_code == 200


async def test_a_bound_key_may_not_name_another_environment_however_it_names_it(client, bound):
    sid = (await client.post("/create_session", headers=bound)).json()["sid"]
    with_sid = {**bound, "X-Session-ID": sid}
    body = {"split": "test", "index": 0}
    assert refused(await client.post("/builtin/math/create", headers=with_sid, json=body))
    assert refused(await client.post("/math/create", headers=with_sid, json=body))
    assert refused(await client.post("/create", headers=with_sid, json={**body, "env_name": "builtin/math"}))
    assert refused(await client.post("/create", headers={**with_sid, "X-Deployment": "builtin/math"}, json=body))
    for path in ("/builtin/math/tools", "/builtin/math/splits"):
        assert refused(await client.get(path, headers=bound))
    assert refused(await client.post("/builtin/math/task", headers=bound, json=body))
    assert not await sync_to_async(Session.objects.exists)()


async def test_a_bound_key_may_not_use_its_teams_sessions_on_other_environments(client, owner, bound):
    sid = await start_episode(client, owner.headers, env="builtin/math", split="test", index=0)
    with_sid = {**bound, "X-Session-ID": sid}
    assert refused(await client.get("/prompt", headers=with_sid))
    assert refused(await client.get("/task_tools", headers=with_sid))
    assert refused(await client.post("/call", headers=with_sid, json={"name": "submit", "input": {"answer": "0"}}))
    assert refused(await client.post("/ping", headers=with_sid))
    assert refused(await client.post("/delete", headers=with_sid))
    session = await sync_to_async(Session.objects.get)(sid=sid)
    assert session.status in (Session.Status.CREATING, Session.Status.READY) and session.calls == 0
    # The unbound key of the same team still uses it.
    assert (await client.get("/prompt", headers={**owner.headers, "X-Session-ID": sid})).status_code == 200


async def test_a_bound_key_whose_environment_is_out_of_reach_never_falls_back_to_builtin_math(
        client, owner, outsider):
    # A key of globex bound to acme's public environment, which then goes private.
    await sync_to_async(environment_publish)(team=owner.team, source_dir=django_settings.ORS_ENVS_DIR / "math",
                                             slug="shared-math", visibility="public")
    env = await sync_to_async(Environment.objects.get)(team=owner.team, slug="shared-math")
    token = (await sync_to_async(api_key_create)(team=outsider.team, name="bound-public", scopes=["sessions"],
                                                 environment=env)).token
    await sync_to_async(Environment.objects.filter(id=env.id).update)(visibility="private")
    headers = {"X-API-Key": token}
    sid = (await client.post("/create_session", headers=headers)).json()["sid"]
    r = await client.post("/create", headers={**headers, "X-Session-ID": sid}, json={"split": "test", "index": 0})
    assert refused(r)
    assert refused(await client.get("/tools", headers=headers))
    assert (await client.get("/list_environments", headers=headers)).json() == []
    assert not await sync_to_async(Session.objects.exists)()
