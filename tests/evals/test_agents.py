"""Registering AAP agents: /meta is read at registration, the key is write-only and encrypted, and
the agent URL must be somewhere the operator lets the platform connect."""

from __future__ import annotations

from orsplatform.evals.models import Agent
from tests.evals.conftest import AGENT_KEY, api, register
from tests.fixtures.server import free_port


def _post(person, **body) -> tuple[int, dict]:
    r = api(person).post("/api/v1/agents", {"name": "a", "agent": "solver", **body}, format="json")
    return r.status_code, r.json()


def test_it_lists_the_agent_with_the_capabilities_read_from_meta(owner, agents):
    agent = register(owner, agents, "solver", "delta", options={"style": "chatty"})
    listed = api(owner).get("/api/v1/agents").json()["agents"]
    assert [a["id"] for a in listed] == [agent["id"]]
    assert listed[0]["protocol_version"] == 1 and listed[0]["version"] == "1.0.0"
    assert set(listed[0]["capabilities"]["stream"]) == {"delta", "message", "none"}
    assert listed[0]["options"] == {"style": "chatty"}


def test_the_api_key_is_stored_encrypted_and_never_returned(owner, agents):
    agent = register(owner, agents)
    row = Agent.objects.get(id=agent["id"])
    assert row.api_key_encrypted and AGENT_KEY not in row.api_key_encrypted
    for url in ("/api/v1/agents", f"/api/v1/agents/{agent['id']}"):
        assert AGENT_KEY not in api(owner).get(url).content.decode()


def test_an_unreachable_meta_is_a_clear_400(owner, agents, settings):
    port = free_port()
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = [f"127.0.0.1:{port}"]
    status, body = _post(owner, url=f"http://127.0.0.1:{port}")
    assert status == 400 and body["detail"].startswith("GET /meta failed: ConnectError")


def test_a_server_of_another_protocol_version_is_refused(owner, agents):
    status, body = _post(owner, url=f"{agents.url}/v4")
    assert status == 400
    assert body["detail"] == "The server speaks AAP version 4; the platform speaks versions 1, 2, 3."


def test_an_agent_the_server_does_not_have_is_refused(owner, agents):
    status, body = _post(owner, url=agents.url, agent="nobody")
    assert status == 400 and "no agent named 'nobody'" in body["detail"]


def test_a_stream_mode_meta_does_not_declare_is_refused(owner, agents):
    # `plain` declares no capabilities.stream: only "none" is supported.
    status, body = _post(owner, url=agents.url, agent="plain", stream="delta")
    assert status == 400 and body["detail"] == "The agent does not support stream 'delta' (it supports: none)."
    assert _post(owner, url=agents.url, agent="plain", stream="none")[0] == 201


def test_an_agent_that_takes_no_application_tools_is_refused(owner, agents):
    status, body = _post(owner, url=agents.url, agent="toolless")
    assert status == 400 and "does not accept application-side tools" in body["detail"]


def test_hosts_outside_the_allow_list_are_refused(owner, agents, settings):
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = ["10.0.0.0/8"]
    status, body = _post(owner, url=agents.url)
    assert status == 400 and "not in ORS_EVAL_AGENT_ALLOWED_HOSTS" in body["detail"]
    settings.ORS_EVAL_AGENT_ALLOWED_HOSTS = []
    status, body = _post(owner, url=agents.url)  # no allow-list: loopback is not public
    assert status == 400 and "non-public address" in body["detail"]
    status, body = _post(owner, url="http://169.254.169.254/latest")
    assert status == 400 and "non-public address" in body["detail"]


def test_ping_reads_meta_again_and_remove_hides_the_agent(owner, agents):
    agent = register(owner, agents)
    r = api(owner).post(f"/api/v1/agents/{agent['id']}/ping")
    assert r.status_code == 200 and r.json()["ok"] is True
    assert api(owner).delete(f"/api/v1/agents/{agent['id']}").status_code == 204
    assert api(owner).get("/api/v1/agents").json()["agents"] == []
    assert api(owner).get(f"/api/v1/agents/{agent['id']}").status_code == 404
    assert Agent.objects.get(id=agent["id"]).api_key_encrypted == ""


def test_a_team_may_reuse_a_removed_agents_name_but_not_a_live_one(owner, agents):
    agent = register(owner, agents)
    status, body = _post(owner, name=agent["name"], url=agents.url, api_key=AGENT_KEY)
    assert status == 400 and "already has an agent named" in body["detail"]
    api(owner).delete(f"/api/v1/agents/{agent['id']}")
    assert _post(owner, name=agent["name"], url=agents.url, api_key=AGENT_KEY)[0] == 201
