"""The hostile tenant of test_hostile_tenants.py on the celery executor, with real processes (a
gateway, a runner node, its sandbox workers, Redis): team B's code reaches neither Redis nor the
runner's memory, team A's secrets cross Redis only sealed to the node, and B's os._exit loses B's
sessions only, while team A's episodes on the same node keep scoring correctly."""

from __future__ import annotations

import base64
import json
import secrets
import threading

import httpx
import pytest

from orsplatform.catalog.services import environment_publish
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import parse_sse, sse_result
from tests.ors.support import publish_probe_sync
from tests.runners.hostile import write_hostile

pytestmark = pytest.mark.e2e
HOSTILE = "globex/hostile"


def canary() -> str:
    return "sbxcanary-" + secrets.token_hex(8)


def secret_header(value: str) -> dict[str, str]:
    body = {"api_key": {"value": value, "allowed_domains": []}}
    return {"X-Secrets": base64.b64encode(json.dumps(body).encode()).decode()}


def open_session(base: str, person, env: str, secret: str | None = None) -> str:
    headers = {**person.headers, **(secret_header(secret) if secret else {})}
    sid = httpx.post(f"{base}/create_session", headers=headers).json()["sid"]
    r = httpx.post(f"{base}/{env}/create", headers={**headers, "X-Session-ID": sid},
                   json={"task_spec": {"id": 0}}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{base}/{env}/prompt", headers={**person.headers, "X-Session-ID": sid}, timeout=60)
    assert r.status_code == 200, r.text
    return sid


def attempt(base: str, person, sid: str, what: str, arg: str = "", n: int = 0) -> dict:
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**person.headers, "X-Session-ID": sid},
                   json={"name": "probe", "input": {"what": what, "arg": arg, "n": n}}, timeout=60)
    result = sse_result(r.text)
    assert "output" in result, result
    return json.loads(result["output"]["blocks"][0]["text"])


def team_a_episode(base: str, owner, env: str, secret: str, n: int) -> None:
    sid = open_session(base, owner, env, secret)
    r = httpx.post(f"{base}/{env}/call", headers={**owner.headers, "X-Session-ID": sid},
                   json={"name": "count", "input": {"n": n}}, timeout=60)
    result = sse_result(r.text)
    assert result["output"]["blocks"][0]["text"] == str(2 * n) and result["output"]["reward"] == 0.5, result
    httpx.post(f"{base}/delete", headers={**owner.headers, "X-Session-ID": sid})


@pytest.fixture
def published(owner, outsider, tmp_path) -> str:
    write_hostile(tmp_path / "hostile")
    environment_publish(team=outsider.team, source_dir=tmp_path / "hostile")
    return publish_probe_sync(owner.team, tmp_path / "a")


def test_team_b_reaches_neither_redis_nor_team_a_on_a_runner_node(cluster, server_factory, owner, outsider,
                                                                  published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url

    # Team A's secret crosses Redis sealed: a MONITOR on the broker sees the setup message, not it.
    a_canary = canary()
    seen: list[str] = []
    monitor_ready = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        with cluster.redis.monitor() as m:
            monitor_ready.set()
            for command in m.listen():
                seen.append(command["command"])
                if stop.is_set():
                    return

    threading.Thread(target=watch, daemon=True).start()
    monitor_ready.wait(10)
    a_sid = open_session(base, owner, published, a_canary)
    stop.set()
    cluster.redis.ping()  # one more command ends the monitor loop
    assert any("runners.node.setup" in c or "lpush" in c.lower() for c in seen)
    assert not any(a_canary in c for c in seen), "a secret crossed Redis in clear"

    b_canary = canary()
    b_sid = open_session(base, outsider, HOSTILE, b_canary)
    environ = attempt(base, outsider, b_sid, "environ")["value"]
    assert not {"REDIS_URL", "CELERY_BROKER_URL", "ORS_REDIS_PREFIX"} & set(environ), environ
    assert attempt(base, outsider, b_sid, "connect", "127.0.0.1:6379")["ok"] is False
    runner_pid = cluster.heartbeat_pid(runner)
    got = attempt(base, outsider, b_sid, "read", f"/proc/{runner_pid}/environ")
    assert got["ok"] is False or cluster.redis_url not in got["value"]
    found = attempt(base, outsider, b_sid, "scan")["value"]
    assert b_canary in found and a_canary not in found

    # os._exit takes B's worker only: the node and team A's session on it carry on.
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**outsider.headers, "X-Session-ID": b_sid},
                   json={"name": "probe", "input": {"what": "exit"}}, timeout=60)
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    assert errors and "globex/hostile@1" in errors[0], r.text

    def answers_410() -> bool:
        r = httpx.get(f"{base}/{HOSTILE}/prompt", headers={**outsider.headers, "X-Session-ID": b_sid}, timeout=30)
        return r.status_code == 410 and "globex/hostile@1" in r.text

    wait_until(answers_410, 15, "B's lost session to answer 410 naming its environment")
    assert cluster.heartbeat_pid(runner) == runner_pid
    r = httpx.post(f"{base}/{published}/call", headers={**owner.headers, "X-Session-ID": a_sid},
                   json={"name": "count", "input": {"n": 4}}, timeout=60)
    assert sse_result(r.text)["output"]["reward"] == 0.5
    for n in range(3):
        team_a_episode(base, owner, published, canary(), n)
    fresh = open_session(base, outsider, HOSTILE)  # a fresh worker for B's next session
    assert attempt(base, outsider, fresh, "environ")["ok"] is True
    wait_until(lambda: cluster.heartbeat_pid(runner) == runner_pid, 5, "the node is still the same process")


def test_on_a_runner_node_runaway_tools_and_forks_stay_in_their_worker(cluster, server_factory, owner, outsider,
                                                                       published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    runner_pid = cluster.heartbeat_pid(runner)
    sid = open_session(base, outsider, HOSTILE)

    # Bounded: the manifest's 64 processes (threads included).
    bomb = attempt(base, outsider, sid, "forkbomb", n=500)["value"]
    assert bomb["stopped"] is not None and bomb["forked"] < 64, bomb
    assert attempt(base, outsider, sid, "alloc", n=2048)["ok"] is False  # past its 512 MiB

    # A sync tool spinning past its 2 s timeout: answered "timeout", then its worker is killed.
    r = httpx.post(f"{base}/{HOSTILE}/call", headers={**outsider.headers, "X-Session-ID": sid},
                   json={"name": "probe", "input": {"what": "spin"}}, timeout=60)
    assert sse_result(r.text)["reason"] == "timeout"

    def lost() -> bool:
        r = httpx.get(f"{base}/{HOSTILE}/prompt", headers={**outsider.headers, "X-Session-ID": sid}, timeout=30)
        return r.status_code == 410 and "outlived its timeout" in r.text

    wait_until(lost, 30, "the spinning worker to be killed and its session to answer 410")
    for n in range(2):  # the node, and team A's sessions on it, carry on
        team_a_episode(base, owner, published, canary(), n)
    assert cluster.heartbeat_pid(runner) == runner_pid
