"""AAP versions 1 to 3: the platform reads an agent's /meta version and speaks that version to it.
Agents shaped as the official TypeScript SDK's server (tests/evals/aap_sdk_agent.py, version 2 as
SDK 0.6 and version 3 as SDK 0.8.0) are evaluated end to end in every stream mode, on math and on
a vision task; a streamed turn that ends before its final event is an agent fault that says so."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.episodes.models import Session
from orsplatform.evals.aap import STREAM_CUT
from orsplatform.evals.aap_versions import ors_blocks_to_aap, ors_tools_to_aap
from orsplatform.evals.models import EvalEpisode
from tests.evals.aap_agent import expected_reward
from tests.evals.conftest import api, launch, register, wait_run

STREAMS = ("none", "message", "delta")
PNG = "iVBORw0KGgo="  # the bytes do not matter to the shapes


def login(person) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.get(username=person.username))
    return client


# --- the shapes each version is sent ----------------------------------------------------------------

def test_a_v1_agent_gets_an_image_as_a_data_url_with_the_v1_fields_alongside():
    blocks = [{"type": "text", "text": "Look:"}, {"type": "image", "data": PNG, "mimeType": "image/png"}]
    assert ors_blocks_to_aap(blocks, 1) == [
        {"type": "text", "text": "Look:"},
        {"type": "image", "url": f"data:image/png;base64,{PNG}", "mimeType": "image/png", "data": PNG}]


@pytest.mark.parametrize("version", [2, 3])
def test_v2_and_v3_agents_get_an_image_as_a_data_url_only(version):
    image = {"type": "image", "data": PNG, "mimeType": "image/jpeg"}
    assert ors_blocks_to_aap([image], version) == [{"type": "image", "url": f"data:image/jpeg;base64,{PNG}"}]


def test_tool_specs_carry_parameters_and_input_schema_only_below_version_3():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    tools = [{"name": "submit", "description": "Submit", "input_schema": schema}]
    for version in (1, 2):
        assert ors_tools_to_aap(tools, version) == [
            {"name": "submit", "description": "Submit", "parameters": schema, "inputSchema": schema}]
    assert ors_tools_to_aap(tools, 3) == [{"name": "submit", "description": "Submit", "parameters": schema}]


# --- registration and the agent pages ---------------------------------------------------------------

@pytest.mark.parametrize("version", [2, 3])
def test_the_agent_is_registered_with_the_version_its_meta_declares_and_the_page_shows_it(owner, sdk_agents, version):
    agent = register(owner, sdk_agents[version], "solver", "delta")
    assert agent["protocol_version"] == version
    listed = api(owner).get(f"/api/v1/agents/{agent['id']}").json()
    assert listed["protocol_version"] == version and listed["tools"] == ["web_search"]
    page = login(owner).get(f"/aap/{owner.team.slug}/agents/").content.decode()
    assert f'<td class="aap-version">v{version}</td>' in page
    r = login(owner).post(f"/aap/{owner.team.slug}/agents/{agent['id']}/ping", follow=True)
    assert f"AAP version {version}." in r.content.decode()


def test_the_agent_endpoints_of_a_v3_agent_keep_to_its_team(owner, member, outsider, sdk_agents):
    agent = register(owner, sdk_agents[3], "solver", "none")
    # A member of the team sees it, its version included, and may ping it; another team sees nothing.
    listed = api(member).get("/api/v1/agents").json()["agents"]
    assert [(a["id"], a["protocol_version"]) for a in listed] == [(agent["id"], 3)]
    assert api(member).post(f"/api/v1/agents/{agent['id']}/ping").status_code == 200
    theirs = api(outsider)
    assert theirs.get("/api/v1/agents").json()["agents"] == []
    assert theirs.get(f"/api/v1/agents/{agent['id']}").status_code == 404
    assert theirs.post(f"/api/v1/agents/{agent['id']}/ping").status_code == 404
    assert theirs.delete(f"/api/v1/agents/{agent['id']}").status_code == 404
    assert "aap-version" not in login(outsider).get(f"/aap/{outsider.team.slug}/agents/").content.decode()
    assert login(outsider).get(f"/aap/{owner.team.slug}/agents/").status_code == 404
    r = theirs.post("/api/v1/eval-runs", {"agent": agent["id"], "environment": "builtin/math", "split": "test",
                                          "stop": 2}, format="json")
    assert r.status_code == 400 and r.json()["detail"] == "No such agent."
    assert api(owner).get(f"/api/v1/agents/{agent['id']}").json()["protocol_version"] == 3


# --- runs, end to end --------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("version", [2, 3])
def test_an_sdk_shaped_agent_is_evaluated_on_math_in_every_stream_mode(owner, sdk_agents, version, stream):
    server = sdk_agents[version]
    agent = register(owner, server, "solver", stream)
    run = wait_run(owner, launch(owner, agent["id"], stop=6)["id"])
    assert run["status"] == "finished" and run["done"] == 6 and run["errors"] == 0, run
    assert {e["task_index"]: e["reward"] for e in run["episodes"]} == {i: expected_reward("test", i) for i in range(6)}
    assert all(e["stop_reason"] == "finished" and e["turns"] == 1 for e in run["episodes"]), run["episodes"]
    stats = server.stats()
    assert stats["created"] == stats["deleted"] == 6 and stats["open"] == 0, stats
    if version == 3:
        # Created apart (201, no turn), then the first turn on its own endpoint, then deleted.
        assert sum(p == "POST /sessions" for p in stats["paths"]) == 6
        assert sum(p.startswith("POST /sessions/") and p.endswith("/turns") for p in stats["paths"]) == 6
        assert sum(p.startswith("DELETE /sessions/") for p in stats["paths"]) == 6
        assert not any(p.startswith(("PUT ", "POST /session/")) for p in stats["paths"])
        assert {tuple(keys) for keys in stats["tool_spec_keys"]} == {("description", "name", "parameters")}
    else:
        assert sum(p == "PUT /session" for p in stats["paths"]) == 6
        assert sum(p.startswith("DELETE /session/") for p in stats["paths"]) == 6
        assert {tuple(keys) for keys in stats["tool_spec_keys"]} == {
            ("description", "inputSchema", "name", "parameters")}
    # The first turn carried the task's prompt as a user message, and the agent's text was kept.
    assert all(m[-1]["role"] == "user" for m in stats["first_messages"]) and len(stats["first_messages"]) == 6
    transcript = EvalEpisode.objects.get(run_id=run["id"], task_index=0).transcript
    assert [t["kind"] for t in transcript] == ["assistant", "tool"]
    assert any(b["type"] == "text" and b["text"].startswith("My answer is") for b in transcript[0]["blocks"])
    sessions = Session.objects.filter(sid__in=[e["sid"] for e in run["episodes"]])
    assert set(sessions.values_list("protocol", "status").distinct()) == {("aap", "deleted")}


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("version", [2, 3])
def test_an_sdk_shaped_agent_sees_the_vision_tasks_images_as_data_urls_and_answers_them(
        owner, sdk_agents, version, stream):
    # `seer` reads the colour from the pixels it was sent: the prompt's image, or (when the task
    # offers `zoom`) the zoomed image in the tool result. Every answer right means every image
    # arrived whole, as `{type, url}` with a data: URL.
    server = sdk_agents[version]
    agent = register(owner, server, "seer", stream)
    run = wait_run(owner, launch(owner, agent["id"], environment="builtin/vision", stop=6)["id"])
    assert run["status"] == "finished" and run["done"] == 6, run
    assert run["passed"] == 6 and run["errors"] == 0, run["episodes"]
    stats = server.stats()
    assert stats["image_failures"] == 0 and {tuple(k) for k in stats["images"]} == {("type", "url")}, stats
    zoomed = [e for e in run["episodes"] if e["tool_calls"] == 2]
    assert len(stats["images"]) == 6 + len(zoomed)  # one per prompt, one per zoom result
    assert zoomed and len(zoomed) < 6, run["episodes"]  # both kinds of task were in the range
    assert all(e["turns"] == 2 for e in zoomed)
    transcript = EvalEpisode.objects.get(run_id=run["id"], task_index=zoomed[0]["task_index"]).transcript
    assert [t["kind"] for t in transcript] == ["assistant", "tool", "assistant", "tool"]
    assert transcript[1]["name"] == "zoom" and transcript[-1]["name"] == "answer" and transcript[-1]["reward"] == 1.0


@pytest.mark.parametrize("stream", ["message", "delta"])
def test_a_streamed_turn_that_ends_before_its_final_event_is_an_agent_fault_that_suggests_stream_none(
        owner, sdk_agents, stream):
    # `hasty`'s server closes every streamed turn before turn_stop (as the SDK 0.8.0 server can).
    server = sdk_agents[3]
    agent = register(owner, server, "hasty", stream)
    run = wait_run(owner, launch(owner, agent["id"], stop=3)["id"])
    assert run["status"] == "finished" and run["done"] == 3 and run["passed"] == 0, run
    for episode in run["episodes"]:
        assert episode["stop_reason"] == "error" and episode["reward"] == 0.0 and episode["tool_calls"] == 0
        assert episode["error"] == STREAM_CUT
    assert 'register this agent with stream "none"' in STREAM_CUT and STREAM_CUT.startswith("Agent fault")
    # The sessions were created apart (POST /sessions), so the platform knew them and deleted them all.
    stats = server.stats()
    assert stats["created"] == stats["deleted"] == 3 and stats["open"] == 0, stats
    # The same agent with stream "none", as the message suggests: scored on its answers.
    agent = register(owner, server, "hasty", "none", name="hasty-json")
    run = wait_run(owner, launch(owner, agent["id"], stop=3)["id"])
    assert run["errors"] == 0 and run["passed"] == sum(expected_reward("test", i) for i in range(3)), run
