"""Which of a caller's secrets an environment receives: another team's (public) environment only the
ones its manifest declares in required_secrets — a /create sending others is refused with a 400
naming them, on every wire form (the body's map, X-Secrets on /create or on /create_session,
OpenEnv's reset) — and never the caller's platform key the openreward client adds; a team's own
environment receives any of its own secrets."""

from __future__ import annotations

import base64
import json
import textwrap

import pytest

from tests.fixtures.ors import sse_result
from tests.ors.support import PROBE_ENV, acount, in_db

DECLARING = "globex/declaring"
MANIFEST = textwrap.dedent('''
    name = "declaring"
    description = "Declares one secret (tests only)."
    entrypoint = "env:Probe"
    visibility = "public"
    required_secrets = ["API_TOKEN"]
''')


@pytest.fixture
async def declaring(outsider, tmp_path):
    from orsplatform.catalog.services import environment_publish

    (tmp_path / "declaring").mkdir()
    (tmp_path / "declaring" / "env.py").write_text(PROBE_ENV)
    (tmp_path / "declaring" / "manifest.toml").write_text(MANIFEST)
    await in_db(lambda: environment_publish(team=outsider.team, source_dir=tmp_path / "declaring"))
    return DECLARING


def x_secrets(values: dict[str, str]) -> dict[str, str]:
    body = {k: {"value": v, "allowed_domains": []} for k, v in values.items()}
    return {"X-Secrets": base64.b64encode(json.dumps(body).encode()).decode()}


async def create(client, person, *, body_secrets=None, create_headers=None, session_headers=None):
    """(the /create response, the sid)."""
    sid = (await client.post("/create_session", headers={**person.headers, **(session_headers or {})})).json()["sid"]
    body = {"split": "train", "index": 0, **({"secrets": body_secrets} if body_secrets else {})}
    r = await client.post(f"/{DECLARING}/create", json=body,
                          headers={**person.headers, "X-Session-ID": sid, **(create_headers or {})})
    return r, sid


async def secrets_seen(client, person, sid: str) -> list[str]:
    r = await client.post(f"/{DECLARING}/call", headers={**person.headers, "X-Session-ID": sid},
                          json={"name": "secrets_seen", "input": {}})
    return sse_result(r.text)["output"]["metadata"]["names"]


@pytest.mark.parametrize("form", ["body", "x-secrets-create", "x-secrets-create-session"])
@pytest.mark.parametrize("who", ["owner", "member"])
async def test_another_teams_environment_is_refused_undeclared_secrets_with_a_400_naming_them(
        client, owner, member, declaring, form, who):
    person = owner if who == "owner" else member
    sent = {"API_TOKEN": "token-value-1234", "OTHER_KEY": "other-value-5678", "MORE": "more-value-9012"}
    if form == "body":
        r, sid = await create(client, person, body_secrets=sent)
    elif form == "x-secrets-create":
        r, sid = await create(client, person, create_headers=x_secrets(sent))
    else:
        r, sid = await create(client, person, session_headers=x_secrets(sent))
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "MORE, OTHER_KEY" in detail and DECLARING in detail and "API_TOKEN" in detail
    assert not any(value in r.text for value in sent.values())
    assert await acount(sid=sid) == 0  # nothing was recorded or started


async def test_declared_secrets_reach_another_teams_environment_and_the_callers_platform_key_never_does(
        client, owner, declaring):
    # What the openreward client sends: the caller's own secrets plus its platform key, twice.
    sent = {"API_TOKEN": "token-value-1234", "api_key": owner.token, "OPENREWARD_API_KEY": owner.token}
    r, sid = await create(client, owner, session_headers=x_secrets(sent))
    assert r.status_code == 200, r.text
    assert await secrets_seen(client, owner, sid) == ["API_TOKEN"]


async def test_a_teams_own_environment_receives_any_of_its_secrets(client, outsider, declaring):
    sent = {"API_TOKEN": "token-value-1234", "OTHER_KEY": "other-value-5678", "api_key": outsider.token}
    r, sid = await create(client, outsider, body_secrets=sent)
    assert r.status_code == 200, r.text
    assert await secrets_seen(client, outsider, sid) == ["API_TOKEN", "OTHER_KEY", "api_key"]


async def test_openenvs_reset_is_refused_undeclared_secrets_for_another_teams_environment(
        client, owner, declaring):
    r = await client.post(f"/openenv/{DECLARING}/reset", headers=owner.headers,
                          json={"split": "train", "index": 0, "secrets": {"OTHER_KEY": "other-value-5678"}})
    assert r.status_code == 400 and "OTHER_KEY" in r.text and "other-value-5678" not in r.text, r.text
    r = await client.post(f"/openenv/{DECLARING}/reset", headers=owner.headers,
                          json={"split": "train", "index": 0, "secrets": {"API_TOKEN": "token-value-1234"}})
    assert r.status_code == 200, r.text


async def test_a_create_naming_no_environment_is_refused_when_its_first_request_names_one(client, owner, declaring):
    # ors.client's split+index form: /create names no environment; the episode is bound (and its
    # secrets checked) by the first environment-scoped request.
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    r = await client.post("/create", headers={**owner.headers, "X-Session-ID": sid},
                          json={"split": "train", "index": 0, "secrets": {"OTHER_KEY": "other-value-5678"}})
    assert r.status_code == 200, r.text
    r = await client.get(f"/{DECLARING}/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 400 and "OTHER_KEY" in r.json()["detail"] and "other-value-5678" not in r.text
    assert await acount(sid=sid) == 0
