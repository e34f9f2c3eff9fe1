"""Authorization on the OpenEnv face: a revoked key's open socket is closed (4401) within the auth
cache time, a key past its cap on open sockets or MCP sessions is refused, creating an MCP session
does not walk the others, and a key bound to one environment reaches no other."""

from __future__ import annotations

import json
import time
from collections import OrderedDict

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from websockets.exceptions import ConnectionClosed

from orsplatform.catalog.models import Environment
from orsplatform.catalog.services import environment_publish
from orsplatform.openenv.sessions import SWEEP_STEP, Episodes
from orsplatform.teams.auth import identify
from orsplatform.teams.services import api_key_create, api_key_revoke
from tests.openenv.test_http import MATH, rpc
from tests.openenv.test_sockets import ask, open_socket

CACHE_SECONDS = 4.0


def closed_code(ws) -> int:
    """The close code the server sent, once the socket is closed (frames before it are drained)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=30)
    return closed.value.rcvd.code


def test_a_revoked_keys_open_socket_is_closed_with_4401_within_the_auth_cache_time(servers, owner):
    server = servers(ORS_AUTH_CACHE_SECONDS=str(CACHE_SECONDS))
    new = api_key_create(team=owner.team, name="revoked-later", scopes=["sessions"])
    headers = {"X-API-Key": new.token}
    with open_socket(server, "builtin/math", headers) as ws, open_socket(server, "builtin/math", owner.headers) as kept:
        reset = ask(ws, {"type": "reset", "data": {"split": "test", "index": 0}})
        assert reset["type"] == "observation"
        assert ask(kept, {"type": "reset", "data": {}})["type"] == "observation"
        api_key_revoke(api_key=new.api_key)
        revoked_at = time.monotonic()
        # The client steps on; it is told why and the socket closes, well before anything else.
        frames = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.send(json.dumps({"type": "state"}))
                frames.append(json.loads(ws.recv(timeout=30)))
        elapsed = time.monotonic() - revoked_at
        assert closed.value.rcvd.code == 4401
        assert elapsed <= CACHE_SECONDS, f"closed {elapsed:.2f} s after revocation"
        with pytest.raises(ConnectionClosed):  # what arrived before the close (a send may see it first)
            while True:
                frames.append(json.loads(ws.recv(timeout=30)))
        assert frames[-1]["type"] == "error" and "revoked" in frames[-1]["data"]["message"]
        assert all(f["type"] == "state" for f in frames[:-1])
        # Another key's socket on the same server is untouched.
        assert ask(kept, {"type": "state"})["type"] == "state"
    with open_socket(server, "builtin/math", headers) as again:
        assert closed_code(again) == 4401


def test_a_key_past_its_socket_cap_is_refused_and_a_closed_socket_frees_its_place(servers, owner, member):
    server = servers(ORS_OPENENV_MAX_SOCKETS_PER_KEY="2")
    first = open_socket(server, "builtin/math", owner.headers)
    second = open_socket(server, "builtin/math", owner.headers)
    assert ask(first, {"type": "state"})["type"] == "state" and ask(second, {"type": "state"})["type"] == "state"
    with open_socket(server, "builtin/math", owner.headers) as third:
        refused = json.loads(third.recv(timeout=30))
        assert refused["data"]["code"] == "CAPACITY_REACHED" and "limit 2" in refused["data"]["message"]
        assert closed_code(third) == 4429
    with open_socket(server, "builtin/math", member.headers) as others:  # the cap is the key's, not the team's
        assert ask(others, {"type": "state"})["type"] == "state"
    first.close()

    def opens() -> bool:
        with open_socket(server, "builtin/math", owner.headers) as ws:
            return ask(ws, {"type": "state"})["type"] == "state"

    deadline = time.monotonic() + 30
    while True:  # the server notices the close shortly after it is sent
        try:
            if opens():
                break
        except ConnectionClosed:
            pass
        assert time.monotonic() < deadline, "the closed socket's place was never freed"
        time.sleep(0.05)  # polling interval while waiting on the condition
    second.close()


async def test_a_key_past_its_mcp_session_cap_is_refused_until_one_closes(client, owner, member, settings):
    settings.ORS_OPENENV_MAX_MCP_SESSIONS_PER_KEY = 2
    ids = []
    for _ in range(2):
        created = (await client.post(f"{MATH}/mcp", headers=owner.headers, json=rpc("openenv/session/create"))).json()
        ids.append(created["result"]["session_id"])
    refused = (await client.post(f"{MATH}/mcp", headers=owner.headers, json=rpc("openenv/session/create"))).json()
    assert refused["error"]["data"] == {"code": "CAPACITY_REACHED"} and "limit 2" in refused["error"]["message"]
    theirs = (await client.post(f"{MATH}/mcp", headers=member.headers, json=rpc("openenv/session/create"))).json()
    assert "session_id" in theirs["result"]
    closed = (await client.post(f"{MATH}/mcp", headers=owner.headers,
                                json=rpc("openenv/session/close", {"session_id": ids[0]}))).json()
    assert closed["result"]["closed"] is True
    again = (await client.post(f"{MATH}/mcp", headers=owner.headers, json=rpc("openenv/session/create"))).json()
    assert "session_id" in again["result"]


class CountingRegistry(OrderedDict):
    """The MCP session registry, counting every session a walk of it yields."""

    looked_at = 0

    def _count(self, it):
        for item in it:
            CountingRegistry.looked_at += 1
            yield item

    def __iter__(self):
        return self._count(super().__iter__())

    def values(self):
        return self._count(super().values())

    def items(self):
        return self._count(super().items())

    def keys(self):
        return self._count(super().keys())


async def test_creating_an_mcp_session_looks_at_as_few_others_with_5000_open_as_with_100(ors_app, owner):
    gateway = ors_app.gateway
    caller = await sync_to_async(identify)(owner.token)
    env = await gateway.environment(caller, "builtin/math")
    episodes = Episodes(gateway)

    def cost_of_creates(open_before: int, creates: int = 20) -> int:
        while len(episodes.mcp_sessions) < open_before:
            episodes.mcp_open(caller, env)
        episodes.mcp_sessions = CountingRegistry(episodes.mcp_sessions)
        CountingRegistry.looked_at = 0
        for _ in range(creates):
            episodes.mcp_open(caller, env)
        looked_at = CountingRegistry.looked_at
        episodes.mcp_sessions = OrderedDict(episodes.mcp_sessions)
        return looked_at

    small, large = cost_of_creates(100), cost_of_creates(5000)
    assert small == large <= 20 * SWEEP_STEP
    assert len(episodes.mcp_sessions) == 5020 and episodes.mcp_per_key[caller.api_key_id] == 5020


async def test_the_sweep_still_retires_abandoned_mcp_sessions_as_creates_go_round(ors_app, owner, settings):
    gateway = ors_app.gateway
    caller = await sync_to_async(identify)(owner.token)
    env = await gateway.environment(caller, "builtin/math")
    episodes = Episodes(gateway)
    abandoned = [episodes.mcp_open(caller, env) for _ in range(50)]
    for session in abandoned:
        session.last_used -= settings.ORS_IDLE_TIMEOUT_SECONDS + 1  # never reset, left long ago
    for _ in range(50):
        episodes.mcp_open(caller, env)
    assert not any(s.id in episodes.mcp_sessions for s in abandoned)
    assert len(episodes.mcp_sessions) == 50 and episodes.mcp_per_key[caller.api_key_id] == 50


# --- keys bound to one environment ------------------------------------------------------------------

@pytest.fixture
def bound_key(owner) -> str:
    environment_publish(team=owner.team, source_dir=django_settings.ORS_ENVS_DIR / "math", slug="own-math",
                        visibility="private")
    env = Environment.objects.get(team=owner.team, slug="own-math")
    return api_key_create(team=owner.team, name="bound", scopes=["sessions"], environment=env).token


async def test_a_bound_key_reaches_no_other_environment_over_http(client, owner, bound_key):
    headers = {"X-API-Key": bound_key}
    for path in ("splits", "metadata"):
        r = await client.get(f"{MATH}/{path}", headers=headers)
        assert r.status_code == 403 and "bound to one environment" in r.json()["detail"]
    r = await client.post(f"{MATH}/reset", headers=headers, json={})
    assert r.status_code == 403
    assert (await client.post(f"{MATH}/mcp", headers=headers, json=rpc("openenv/session/create"))).status_code == 403
    own = await client.post("/openenv/acme/own-math/reset", headers=headers, json={"split": "test", "index": 0})
    assert own.status_code == 200
    assert own.json()["observation"]["metadata"]["environment"] == "acme/own-math@1"


def test_a_bound_keys_socket_on_another_environment_is_closed_with_4403(server, owner, bound_key):
    headers = {"X-API-Key": bound_key}
    with open_socket(server, "builtin/math", headers) as ws:
        refused = json.loads(ws.recv(timeout=30))
        assert refused["data"]["code"] == "SESSION_ERROR" and "bound to one environment" in refused["data"]["message"]
        assert closed_code(ws) == 4403
    with open_socket(server, "acme/own-math", headers) as ws:
        reset = ask(ws, {"type": "reset", "data": {}})
        assert reset["data"]["observation"]["metadata"]["environment"] == "acme/own-math@1"
    assert httpx.get(f"{server.url}{MATH}/splits", headers=headers, timeout=30).status_code == 403
