"""The ``/ws`` socket at the frame level (a raw WebSocket client, so malformed frames can be sent),
tenancy, the team's open-session limit, dropped sockets, and sockets outside ``/openenv/``."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from orsplatform.episodes.models import Session
from orsplatform.teams.auth import key_cache
from orsplatform.teams.models import Team
from tests.e2e.helpers import wait_for
from tests.openenv.conftest import base_url
from tests.ors.support import PROBE, publish_probe_sync


def ws_url(server, env: str) -> str:
    return base_url(server, env).replace("http://", "ws://") + "/ws"


def open_socket(server, env: str, headers: dict[str, str], query: str = "") -> ClientConnection:
    return connect(ws_url(server, env) + query, additional_headers=headers, open_timeout=10)


def ask(ws: ClientConnection, frame) -> dict:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    return json.loads(ws.recv(timeout=30))


def test_bad_frames_get_openenv_errors_and_the_socket_keeps_serving(server, owner):
    with open_socket(server, "builtin/math", owner.headers) as ws:
        assert ask(ws, "{not json")["data"]["code"] == "INVALID_JSON"
        assert ask(ws, "[1, 2]")["data"]["code"] == "VALIDATION_ERROR"
        unknown = ask(ws, {"type": "dance"})
        assert unknown["type"] == "error" and unknown["data"]["code"] == "UNKNOWN_TYPE"
        missing = ask(ws, {"type": "step"})["data"]
        assert missing["code"] == "VALIDATION_ERROR" and missing["errors"][0]["loc"] == ["data"]
        no_name = ask(ws, {"type": "step", "data": {"type": "call_tool"}})["data"]
        assert no_name["code"] == "VALIDATION_ERROR" and no_name["errors"][0]["loc"] == ["tool_name"]
        extra = ask(ws, {"type": "state", "bogus": 1})["data"]
        assert extra["code"] == "VALIDATION_ERROR"
        before = ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "submit"}})["data"]
        assert before["code"] == "EXECUTION_ERROR" and "reset()" in before["message"]
        assert ask(ws, {"type": "reset", "data": {"split": "nope", "index": 0}})["data"]["code"] == "VALIDATION_ERROR"
        assert ask(ws, {"type": "reset", "data": {"split": "test"}})["data"]["code"] == "VALIDATION_ERROR"
        assert ask(ws, {"type": "reset", "data": {"index": -1}})["data"]["code"] == "VALIDATION_ERROR"
        assert not Session.objects.exists()  # nothing above opened an episode

        reset = ask(ws, {"type": "reset", "data": {"split": "test", "index": 2}})
        assert reset["type"] == "observation" and reset["data"]["reward"] is None
        answer = reset["data"]["observation"]["metadata"]["task_spec"]["answer"]
        step = ask(ws, {"type": "step", "data": {"type": "call_tool", "tool_name": "submit",
                                                  "arguments": {"answer": answer}}})
        assert step["data"]["reward"] == 1.0 and step["data"]["done"] is True
        state = ask(ws, {"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 1
        tools = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 5, "method": "tools/list"}})
        assert tools["type"] == "mcp" and tools["data"]["id"] == 5
        assert [t["name"] for t in tools["data"]["result"]["tools"]] == ["submit"]
        nothing = ask(ws, {"type": "mcp", "data": {"jsonrpc": "2.0", "id": 6, "method": "resources/list"}})
        assert nothing["data"]["error"]["code"] == -32601
        ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).count() == 1, what="episode ended")


def test_a_team_at_its_open_session_limit_gets_capacity_reached_then_a_close(server, owner, member):
    Team.objects.filter(pk=owner.team.pk).update(max_open_sessions=1)
    key_cache.clear()
    with open_socket(server, "builtin/math", owner.headers) as first:
        assert ask(first, {"type": "reset", "data": {}})["type"] == "observation"
        with open_socket(server, "builtin/math", member.headers) as second:
            refused = ask(second, {"type": "reset", "data": {}})
            assert refused["data"]["code"] == "CAPACITY_REACHED" and "capacity" in refused["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                second.recv(timeout=10)
            assert closed.value.rcvd.code == 4429
        # The unmodified client raises it, as for upstream's own capacity refusal.
        with GenericEnvClient(base_url=base_url(server, "builtin/math"), headers=member.headers).sync() as env:
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                env.reset()
    # The slot is free again once the first socket is gone.
    wait_for(lambda: not Session.objects.filter(status__in=["creating", "ready"]).exists(), what="slot freed")
    with GenericEnvClient(base_url=base_url(server, "builtin/math"), headers=member.headers).sync() as env:
        assert env.reset().done is False


def _drop(ws: ClientConnection) -> None:
    """Lose the connection without a closing handshake (a crashed trainer, a cut network)."""
    ws.socket.shutdown(socket.SHUT_RDWR)
    ws.socket.close()


def test_a_dropped_socket_ends_its_episode_even_during_a_long_tool_call(server, owner, tmp_path):
    publish_probe_sync(owner.team, tmp_path)
    ws = open_socket(server, PROBE, owner.headers)
    assert ask(ws, {"type": "reset", "data": {"split": "train", "index": 0}})["type"] == "observation"
    ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "nap",
                                                  "arguments": {"seconds": 60}}}))
    wait_for(lambda: Session.objects.filter(status=Session.Status.READY).exists() or
             Session.objects.filter(status=Session.Status.CREATING).exists(), what="episode open")
    _drop(ws)
    # Well before the 60 s call would have ended.
    session = wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).first(), timeout=10,
                       what="episode ended after the drop")
    assert session.ended_at is not None and session.protocol == Session.Protocol.OPENENV


def test_a_dropped_idle_socket_ends_its_episode(server, owner):
    ws = open_socket(server, "builtin/wordle", owner.headers)
    assert ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
    _drop(ws)
    wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).exists(), timeout=10,
             what="episode ended after the drop")


def test_another_teams_private_environment_answers_as_if_it_did_not_exist(server, owner, outsider, tmp_path):
    publish_probe_sync(owner.team, tmp_path)
    answers = {}
    for env in (PROBE, "acme/nothing"):
        with open_socket(server, env, outsider.headers) as ws:
            frame = json.loads(ws.recv(timeout=10))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        answers[env] = (frame["data"]["code"], frame["data"]["message"].replace(env, "X"), closed.value.rcvd.code)
    assert answers[PROBE] == answers["acme/nothing"] == (
        "SESSION_ERROR", "Environment 'X' not found. No environment this key may use has a similar name.", 4404)

    with httpx.Client(base_url=server.url, headers=outsider.headers) as http:
        for path in ("health", "metadata", "schema", "splits"):
            assert http.get(f"/openenv/{PROBE}/{path}").status_code == 404
        r = http.post(f"/openenv/{PROBE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"})
        assert r.status_code == 404
    with httpx.Client(base_url=server.url, headers=owner.headers) as http:
        assert http.get(f"/openenv/{PROBE}/health").json() == {"status": "healthy"}

    # An MCP session of the owner's team is not the outsider's to attach to or call.
    with httpx.Client(base_url=server.url) as http:
        created = http.post("/openenv/builtin/math/mcp", headers=owner.headers,
                            json={"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"}).json()
        sid = created["result"]["session_id"]
        r = http.post("/openenv/builtin/math/mcp", headers=outsider.headers, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "submit", "arguments": {"answer": "1"}, "session_id": sid}}).json()
        assert r["error"]["code"] == -32602 and "Unknown session_id" in r["error"]["message"]
    with open_socket(server, "builtin/math", outsider.headers, f"?session_id={sid}") as ws:
        assert "Unknown session_id" in json.loads(ws.recv(timeout=10))["data"]["message"]
    assert not Session.objects.filter(team=outsider.team).exists()


@pytest.mark.parametrize("path", ["/ws", "/builtin/math/ws", "/api/ws", "/openenv/builtin/math/nope",
                                  "/openenv/a/b/c/ws", "/openenv/ws"])
def test_websockets_outside_an_openenv_socket_path_are_refused_never_a_500(server, path):
    with pytest.raises(InvalidStatus) as refused:
        connect(server.url.replace("http://", "ws://") + path, open_timeout=10)
    assert refused.value.response.status_code == 403


def test_a_tool_call_longer_than_the_keepalive_keeps_its_socket_and_answers(server, owner, tmp_path):
    # The client pings every half second and gives up after half a second without a pong; the call
    # takes seconds. The server answers pings while the call runs, so only message_timeout_s matters.
    publish_probe_sync(owner.team, tmp_path)
    env = GenericEnvClient(base_url=base_url(server, PROBE), headers=owner.headers, message_timeout_s=60,
                           websocket_ping_interval_s=0.5, websocket_ping_timeout_s=0.5).sync()
    with env:
        env.reset(split="train", index=0)
        out = env.step({"type": "call_tool", "tool_name": "nap", "arguments": {"seconds": 3}})
        assert out.observation["result"]["blocks"][0]["text"] == "rested"
        assert env.state()["step_count"] == 1
