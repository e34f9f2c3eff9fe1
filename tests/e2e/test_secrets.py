"""Secrets reach the environment instance, and are stored nowhere: not in any database row, not in
the server's log. Both wire forms are covered: the ``X-Secrets`` header (what the official clients
send) and the ``/create`` body's ``secrets`` map."""

from __future__ import annotations

import secrets as pysecrets

import httpx
from openreward import OpenReward
from ors.client import ORS
from ors.client.session import _build_secrets_header

from orsplatform.episodes.models import Session, ToolCall
from tests.e2e.helpers import database_dump, raw_call, raw_episode, sse_result


def canary() -> str:
    return f"s3cr3t-{pysecrets.token_hex(12)}"


def test_secrets_reach_the_environment_through_header_and_body_and_are_stored_nowhere(
        server, owner, openreward_at):
    via_ors_header, via_body, via_openreward = canary(), canary(), canary()
    sids = []

    # 1. ors.client: session(task, secrets=...) sends X-Secrets on /create_session and /create.
    with ORS(base_url=server.url, api_key=owner.token) as client:
        env = client.environment("math")
        task = env.get_task("test", 11)
        with env.session(task=task, secrets={"canary": via_ors_header}) as session:
            sids.append(session.sid)
            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0
            assert out.metadata["secrets_seen"] == ["canary"]

    # 2. Raw HTTP: the /create body's "secrets" map (plain string and {"value": ...} forms).
    with httpx.Client(base_url=server.url, timeout=30) as http:
        sid = raw_episode(http, owner.headers, "math", split="test", index=12,
                          secrets={"canary": via_body, "other": {"value": "not-the-canary"}})
        sids.append(sid)
        result = sse_result(raw_call(http, owner.headers, "math", sid,
                                     {"name": "submit", "input": {"answer": "0"}}).text)
        assert result["ok"] is True, result
        assert result["output"]["metadata"]["secrets_seen"] == ["canary", "other"]
        assert http.post("/delete", headers={**owner.headers, "X-Session-ID": sid}).status_code == 200

    # 3. openreward: session(task, secrets=...) also sends X-Secrets (plus its own api_key entries);
    # a name it does not know needs its allowed domains spelled out.
    openreward_at(server.url)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        task = env.get_task("test", 13)
        with env.session(task=task, secrets={"canary": (via_openreward, ["127.0.0.1"])}) as session:
            sids.append(session.sid)
            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0
            assert "canary" in out.metadata["secrets_seen"]
    finally:
        client.close()

    # The episodes were recorded...
    assert Session.objects.filter(sid__in=sids, status=Session.Status.DELETED).count() == 3
    assert ToolCall.objects.filter(session__sid__in=sids).count() == 3
    # ...but no secret value, nor the encoded header carrying it, was written anywhere.
    dump = database_dump()
    log = server.log()
    forbidden = {
        "ors X-Secrets value": via_ors_header,
        "ors X-Secrets header": _build_secrets_header({"canary": via_ors_header}),
        "body secret": via_body,
        "openreward X-Secrets value": via_openreward,
        "API key": owner.token,
    }
    for label, value in forbidden.items():
        assert value not in dump, f"{label} is stored in the database"
        assert value not in log, f"{label} appears in the server log"
