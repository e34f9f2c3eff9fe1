"""Secrets reach the environment instance and nothing else: after episodes with a canary secret
(in the body, in X-Secrets on /create and on /create_session), including an environment that puts
the secret into its exceptions and outputs, the canary is in no database row, no log line and no
rendered page."""

import base64
import io
import json
import logging
import textwrap
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from orsplatform.catalog.services import environment_publish
from tests.fixtures.ors import parse_sse, sse_result, start_episode

CANARY = "canary-7f3a9c2e1b5d4e60"

LEAKY_ENV = textwrap.dedent('''
    from pydantic import BaseModel
    from ors import Environment, Split, TextBlock, ToolOutput, tool

    class Echo(BaseModel):
        text: str

    class Leaky(Environment):
        def __init__(self, task_spec=None, secrets=None):
            super().__init__(task_spec or {}, secrets or {})
            self.secrets = secrets or {}
            if (task_spec or {}).get("fail_setup"):
                raise RuntimeError("cannot start with key " + self.secrets.get("canary", ""))

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}, {"id": 1, "fail_setup": True}]

        def get_prompt(self):
            return [TextBlock(text="leak it")]

        @tool
        def reveal(self) -> ToolOutput:
            """Puts the secret into its output."""
            return ToolOutput(blocks=[TextBlock(text="the key is " + self.secrets["canary"])], reward=0.0)

        @tool
        def explode(self, params: Echo) -> ToolOutput:
            """Raises with the secret in the message."""
            raise ValueError("bad key " + self.secrets["canary"] + " " + params.text)
''')


def secret_header(value: str) -> str:
    return base64.b64encode(json.dumps({"canary": {"value": value, "allowed_domains": []}}).encode()).decode()


@pytest.fixture
def leaky_env(owner, tmp_path):
    (tmp_path / "env.py").write_text(LEAKY_ENV)
    (tmp_path / "manifest.toml").write_text('name = "leaky"\nentrypoint = "env:Leaky"\nvisibility = "private"\n')
    return environment_publish(team=owner.team, source_dir=tmp_path).version


async def test_a_canary_secret_is_never_stored_logged_or_shown(client, owner, leaky_env, caplog):
    caplog.set_level(logging.DEBUG)
    headers = owner.headers

    # math, secrets in the body
    sid = await start_episode(client, headers, split="train", index=1, secrets={"canary": CANARY})
    r = await client.post("/math/call", headers={**headers, "X-Session-ID": sid},
                          json={"name": "submit", "input": {"answer": "1"}})
    assert "canary" in sse_result(r.text)["output"]["metadata"]["secrets_seen"]
    await client.post("/delete", headers={**headers, "X-Session-ID": sid})

    # leaky env, secret in X-Secrets on /create_session only
    r = await client.post("/create_session", headers={**headers, "X-Secrets": secret_header(CANARY)})
    sid = r.json()["sid"]
    r = await client.post("/create", headers={**headers, "X-Session-ID": sid},
                          json={"env_name": "acme/leaky", "split": "train", "index": 0})
    assert r.status_code == 200
    session_headers = {**headers, "X-Session-ID": sid}
    r = await client.post("/acme/leaky/call", headers=session_headers, json={"name": "reveal", "input": {}})
    assert CANARY in sse_result(r.text)["output"]["blocks"][0]["text"]  # the caller gets what the env said
    r = await client.post("/acme/leaky/call", headers=session_headers,
                          json={"name": "explode", "input": {"text": "x"}})
    error = [d for e, d in parse_sse(r.text) if e == "error"][0]
    assert "bad key" in error and CANARY not in error

    # leaky env failing its setup, secret in X-Secrets on /create
    sid = (await client.post("/create_session", headers=headers)).json()["sid"]
    r = await client.post("/create", headers={**headers, "X-Session-ID": sid, "X-Secrets": secret_header(CANARY)},
                          json={"env_name": "acme/leaky", "split": "train", "index": 1})
    r = await client.get("/acme/leaky/prompt", headers={**headers, "X-Session-ID": sid})
    assert r.status_code == 500 and "cannot start" in r.json()["detail"] and CANARY not in r.text

    await sync_to_async(_assert_nowhere_at_rest)(caplog.text)


def _assert_nowhere_at_rest(log_text: str) -> None:
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert CANARY not in dump.getvalue()
    assert CANARY not in log_text

    from orsplatform.episodes.models import Session, ToolCall

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    web = Client()
    web.force_login(admin)
    pages = ["/", "/console/", "/console/acme/", "/admin/episodes/session/", "/admin/episodes/toolcall/",
             "/admin/teams/apikey/"]
    pages += [f"/admin/episodes/session/{pk}/change/" for pk in Session.objects.values_list("pk", flat=True)]
    pages += [f"/admin/episodes/toolcall/{pk}/change/" for pk in ToolCall.objects.values_list("pk", flat=True)]
    for sid in Session.objects.values_list("sid", flat=True):
        pages.append(f"/api/v1/sessions/{sid}")
    for page in pages:
        response = web.get(page, HTTP_X_API_KEY=_owner_token())
        assert response.status_code == 200, page
        assert CANARY not in response.content.decode(), page


def _owner_token() -> str:
    from orsplatform.teams.models import Team
    from orsplatform.teams.services import api_key_create

    # A name of its own each time: two live keys of a team cannot share one.
    return api_key_create(team=Team.objects.get(slug="acme"), name=f"reader-{uuid.uuid4().hex[:8]}").token
