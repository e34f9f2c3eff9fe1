"""The celery executor with real processes: runner nodes, a platform worker with beat, and real
gateways (daphne), on Redis and the test database."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from openreward import OpenReward
from ors.client import ORS

from orsplatform.episodes.models import Session, ToolCall
from orsplatform.executors.keys import Keys, runner_hostname
from tests.fixtures.celery import wait_until
from tests.fixtures.ors import parse_sse, sse_result

pytestmark = pytest.mark.e2e


def open_session(base: str, person, env: str = "math", **create) -> str:
    sid = httpx.post(f"{base}/create_session", headers=person.headers).json()["sid"]
    r = httpx.post(f"{base}/{env}/create", headers={**person.headers, "X-Session-ID": sid},
                   json=create or {"split": "train", "index": 0}, timeout=30)
    assert r.status_code == 200, r.text
    return sid


def h(person, sid: str) -> dict:
    return {**person.headers, "X-Session-ID": sid}


def start_long_call(cluster, base: str, person, sid: str) -> tuple[threading.Thread, list]:
    """A 30 s call on the code environment, in a thread, once its runner has it; the thread fills
    the list with the stream's events."""
    events: list = []

    def long_call() -> None:
        r = httpx.post(f"{base}/code/call", headers=h(person, sid), timeout=60,
                       json={"name": "run", "input": {"code": SLEEPY.format(s=30)}})
        events.extend(parse_sse(r.text))

    caller = threading.Thread(target=long_call)
    caller.start()
    wait_until(lambda: cluster.redis.zcard(f"{cluster.prefix}:running-calls"), 15, "call started")
    return caller, events


def answered(r: httpx.Response) -> httpx.Response | None:
    """The response once it is no longer a 200 (for wait_until)."""
    return r if r.status_code != 200 else None


def code_task_with_sleep(seconds: float) -> dict:
    return {"id": "sleepy", "prompt": "sleep", "entry": "f", "tests": ["assert f() == 1"],
            "timeout_seconds": 60, "_sleep": seconds}


SLEEPY = "import time\ntime.sleep({s})\ndef f():\n    return 1\n"


def test_an_episode_runs_end_to_end_through_runner_nodes_with_the_official_client(cluster, server_factory, owner):
    runners = {cluster.start_runner(), cluster.start_runner()}
    gateway = server_factory(**cluster.env())
    client = ORS(base_url=gateway.url, api_key=owner.token)
    try:
        math = client.environment("math")
        task = math.get_task("test", 3)
        with math.session(task=task) as session:
            assert task.task_spec["question"] in session.get_prompt()[0].text
            result = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert result.reward == 1.0 and result.finished
            sid = session.sid
        with math.session(split="train", index=4) as session:
            assert session.call_tool("submit", {"answer": "-1"}).reward == 0.0
    finally:
        client.close()
    row = Session.objects.get(sid=sid)
    assert runner_hostname(row.runner) in runners
    wait_until(lambda: Session.objects.get(sid=sid).status == "deleted", 10, "session deleted")
    call = ToolCall.objects.get(session__sid=sid)
    assert call.status == "ok" and call.reward == 1.0 and call.finished


def test_an_openreward_episode_runs_through_runner_nodes(cluster, server_factory, owner, monkeypatch):
    cluster.start_runner()
    gateway = server_factory(**cluster.env())
    for name in ("OPENREWARD_SESSION_URL", "OPENREWARD_API_URL"):
        monkeypatch.setenv(name, gateway.url)
    monkeypatch.setenv("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    client = OpenReward(api_key=owner.token)
    try:
        env = client.environments.get("builtin/math")
        task = env.get_task("test", 5)
        with env.session(task=task) as session:
            sid = session.sid
            assert task.task_spec["question"] in session.get_prompt()[0].text
            out = session.call_tool("submit", {"answer": task.task_spec["answer"]})
            assert out.reward == 1.0 and out.finished is True
    finally:
        client.close()
    wait_until(lambda: Session.objects.get(sid=sid).status == "deleted", 10, "session deleted")
    row = Session.objects.get(sid=sid)
    assert row.calls == 1 and row.total_reward == 1.0 and row.finished


def test_a_long_call_on_a_runner_keeps_its_stream_alive_with_pings(cluster, server_factory, owner):
    cluster.start_runner()
    gateway = server_factory(**cluster.env(ORS_SSE_PING_SECONDS="0.5"))
    sid = open_session(gateway.url, owner, env="code", task_spec=code_task_with_sleep(0))
    r = httpx.post(f"{gateway.url}/code/call", headers=h(owner, sid), timeout=60,
                   json={"name": "run", "input": {"code": SLEEPY.format(s=3)}})
    events = parse_sse(r.text)
    kinds = [e for e, _ in events]
    assert kinds.count(":") >= 3, kinds  # a ping every 0.5 s while the runner works
    assert kinds[-1] == "end" and sse_result(r.text)["ok"]


def test_two_gateways_serve_one_session_interchangeably(cluster, server_factory, owner):
    cluster.start_runner()
    a = server_factory(**cluster.env())
    b = server_factory(**cluster.env())
    sid = open_session(a.url, owner, env="code", task_spec=code_task_with_sleep(0))
    r = httpx.get(f"{b.url}/code/prompt", headers=h(owner, sid), timeout=30)
    assert r.status_code == 200 and r.json()[0]["type"] == "text"

    # A long call starts on A; the client drops it and reconnects by task_id on B.
    task_id = None
    with httpx.stream("POST", f"{a.url}/code/call", headers=h(owner, sid), timeout=30,
                      json={"name": "run", "input": {"code": SLEEPY.format(s=2)}}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                task_id = line.split(":", 1)[1].strip()
                break
    assert task_id
    r = httpx.post(f"{b.url}/code/call", headers=h(owner, sid), json={"task_id": task_id}, timeout=30)
    result = sse_result(r.text)
    assert result["ok"] and result["output"]["reward"] == 1.0
    # The episode finished on the runner, whichever gateway is asked next.
    r = httpx.post(f"{b.url}/code/call", headers=h(owner, sid), timeout=30,
                   json={"name": "run", "input": {"code": SLEEPY.format(s=0)}})
    assert sse_result(r.text)["reason"] == "episode_finished"
    # Delete on B: A sees the deletion within its session cache time.
    assert httpx.post(f"{b.url}/delete", headers=h(owner, sid)).status_code == 200
    wait_until(lambda: httpx.post(f"{a.url}/ping", headers=h(owner, sid)).status_code == 410, 10, "410 on A")
    assert Session.objects.get(sid=sid).calls == 2


def test_a_session_deleted_through_one_gateway_is_dropped_at_once_by_the_others(cluster, server_factory, owner,
                                                                                member, outsider):
    # A session cache long enough that only the deleting gateway's broadcast can explain B's 410.
    cluster.start_runner()
    a = server_factory(**cluster.env(), ORS_SESSION_CACHE_SECONDS="300")
    b = server_factory(**cluster.env(), ORS_SESSION_CACHE_SECONDS="300")
    sid = open_session(a.url, owner, env="math")
    assert httpx.get(f"{b.url}/math/prompt", headers=h(owner, sid), timeout=30).status_code == 200
    assert httpx.post(f"{b.url}/ping", headers=h(member, sid)).status_code == 200  # B serves its copy
    assert httpx.post(f"{b.url}/ping", headers=h(outsider, sid)).status_code == 404  # to its team only

    assert httpx.post(f"{a.url}/delete", headers=h(owner, sid)).status_code == 200
    wait_until(lambda: httpx.post(f"{b.url}/ping", headers=h(owner, sid)).status_code == 410, 10, "410 on B")
    r = httpx.get(f"{b.url}/math/prompt", headers=h(member, sid), timeout=30)
    assert r.status_code == 410 and r.json() == {"detail": "Session was deleted."}
    assert httpx.post(f"{b.url}/ping", headers=h(outsider, sid)).status_code == 404


def test_a_killed_runner_ends_its_calls_with_an_error_and_spares_other_runners(cluster, server_factory, owner):
    first, second = cluster.start_runner(), cluster.start_runner()
    cluster.start_platform_worker()
    gateway = server_factory(**cluster.env())
    sids = [open_session(gateway.url, owner, env="code", task_spec=code_task_with_sleep(0)) for _ in range(2)]
    by_runner = {runner_hostname(Session.objects.get(sid=s).runner): s for s in sids}
    assert set(by_runner) == {first, second}, "sessions are placed on the least loaded runner"
    doomed, survivor = by_runner[first], by_runner[second]
    # A call recorded before the kill must survive it (one that does not finish the episode).
    r = httpx.post(f"{gateway.url}/code/call", headers=h(owner, doomed), timeout=30,
                   json={"name": "no_such_tool", "input": {}})
    assert sse_result(r.text)["ok"] is False
    recorded = list(ToolCall.objects.filter(session__sid=doomed).values_list("task_id", "status", "output"))
    assert len(recorded) == 1
    before = ToolCall.objects.count()

    caller, events = start_long_call(cluster, gateway.url, owner, doomed)
    killed_at = time.monotonic()
    cluster.kill_runner(first)
    caller.join(timeout=30)
    assert not caller.is_alive(), "the stream must end"
    assert time.monotonic() - killed_at < 15, "within the stated bound (heartbeat TTL + poll)"
    assert [e for e, _ in events if e != ":"][-1] == "error"
    wait_until(lambda: Session.objects.get(sid=doomed).status == "lost", 20, "session marked lost")
    r = httpx.post(f"{gateway.url}/ping", headers=h(owner, doomed))
    assert r.status_code == 410 and "lost" in r.json()["detail"].lower()
    # The interrupted call is in the audit log, as an error.
    wait_until(lambda: ToolCall.objects.filter(session__sid=doomed, status="error").exclude(
        task_id=recorded[0][0]).exists(), 10, "audit row of the interrupted call")
    assert ToolCall.objects.count() >= before + 1
    assert list(ToolCall.objects.filter(task_id=recorded[0][0]).values_list("task_id", "status", "output")) == recorded
    # The other runner's session is untouched.
    r = httpx.post(f"{gateway.url}/code/call", headers=h(owner, survivor), timeout=30,
                   json={"name": "run", "input": {"code": SLEEPY.format(s=0)}})
    assert sse_result(r.text)["ok"]


def test_idle_sessions_expire_on_the_beat(cluster, server_factory, owner):
    runner = cluster.start_runner()
    cluster.start_platform_worker(ORS_IDLE_TIMEOUT_SECONDS="2")
    gateway = server_factory(**cluster.env(ORS_IDLE_TIMEOUT_SECONDS="2"))
    sid = open_session(gateway.url, owner)
    wait_until(lambda: cluster.heartbeat(runner)["sessions"] == 1, 10, "the instance is on the runner")
    wait_until(lambda: Session.objects.get(sid=sid).status == "expired", 20, "session expired")
    r = httpx.post(f"{gateway.url}/ping", headers=h(owner, sid))
    assert r.status_code == 404 and "expired" in r.json()["detail"]
    # Torn down on its runner, not only marked in the database.
    wait_until(lambda: cluster.heartbeat(runner)["sessions"] == 0, 10, "the instance torn down")
    assert json.loads(cluster.redis.get(f"{cluster.prefix}:state:{sid}")) == {"state": "gone"}


def test_a_call_longer_than_the_idle_timeout_keeps_its_session_open(cluster, server_factory, owner):
    cluster.start_runner()
    cluster.start_platform_worker(ORS_IDLE_TIMEOUT_SECONDS="2")
    gateway = server_factory(**cluster.env(ORS_IDLE_TIMEOUT_SECONDS="2"))
    sid = open_session(gateway.url, owner, env="code", task_spec=code_task_with_sleep(0))
    r = httpx.post(f"{gateway.url}/code/call", headers=h(owner, sid), timeout=60,
                   json={"name": "run", "input": {"code": SLEEPY.format(s=5)}})
    assert sse_result(r.text)["ok"], "the session was not expired under the running call"
    assert Session.objects.get(sid=sid).status == "ready"
    # Idle from here on: the beat expires it.
    wait_until(lambda: Session.objects.get(sid=sid).status == "expired", 20, "session expired")


def test_a_restarted_runner_does_not_resurrect_lost_sessions(cluster, server_factory, owner):
    hostname = cluster.start_runner("phoenix")
    cluster.start_platform_worker()
    gateway = server_factory(**cluster.env())
    old = open_session(gateway.url, owner)
    assert httpx.get(f"{gateway.url}/math/prompt", headers=h(owner, old), timeout=30).status_code == 200
    cluster.kill_runner(hostname)
    wait_until(lambda: Session.objects.get(sid=old).status == "lost", 20, "session marked lost")
    assert cluster.start_runner("phoenix") == hostname
    assert httpx.post(f"{gateway.url}/ping", headers=h(owner, old)).status_code == 410
    new = open_session(gateway.url, owner)
    r = httpx.post(f"{gateway.url}/math/call", headers=h(owner, new), timeout=30,
                   json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["ok"]


def test_a_runner_restarted_under_its_name_before_its_heartbeat_expires_is_another_runner(
        cluster, server_factory, owner):
    """A container's restart policy brings a killed node back under the same name within a second:
    its predecessor's sessions are lost all the same, a call running there ends with an error, and
    a setup still queued for the predecessor is dropped, not run on the new process."""
    hostname = cluster.start_runner("lazarus")
    cluster.start_platform_worker()
    gateway = server_factory(**cluster.env())
    old = open_session(gateway.url, owner, env="code", task_spec=code_task_with_sleep(0))
    assert httpx.get(f"{gateway.url}/code/prompt", headers=h(owner, old), timeout=30).status_code == 200
    caller, events = start_long_call(cluster, gateway.url, owner, old)
    cluster.kill_runner(hostname)
    # Placed while the dead node's heartbeat still stands: its setup waits in the node's queue.
    queued = open_session(gateway.url, owner)
    killed_at = time.monotonic()
    assert cluster.start_runner("lazarus") == hostname  # same name, same queue, new process

    caller.join(timeout=30)
    assert not caller.is_alive() and time.monotonic() - killed_at < 15, "the stream ends within the bound"
    assert [e for e, _ in events if e != ":"][-1] == "error"
    for sid in (old, queued):
        wait_until(lambda sid=sid: Session.objects.get(sid=sid).status == "lost", 20, f"{sid} marked lost")
        # The gateway re-reads a session's row every ORS_SESSION_CACHE_SECONDS.
        r = wait_until(lambda sid=sid: answered(httpx.post(f"{gateway.url}/ping", headers=h(owner, sid))),
                       10, f"{sid} answered as lost")
        assert r.status_code == 410 and "lost" in r.json()["detail"].lower()
    record = json.loads(cluster.redis.get(f"{cluster.prefix}:state:{queued}"))
    assert record["state"] != "ready", "the queued setup must not run on the new process"
    # The new process takes new sessions.
    new = open_session(gateway.url, owner)
    r = httpx.post(f"{gateway.url}/math/call", headers=h(owner, new), timeout=30,
                   json={"name": "submit", "input": {"answer": "0"}})
    assert sse_result(r.text)["ok"]
    assert runner_hostname(Session.objects.get(sid=new).runner) == hostname
    assert Session.objects.get(sid=new).runner != Session.objects.get(sid=old).runner


def test_a_duplicate_delivery_never_runs_a_call_twice(cluster, server_factory, owner):
    from orsplatform.executors import inbox

    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    sid = open_session(gateway.url, owner, env="wordle", split="train", index=0)
    assert httpx.get(f"{gateway.url}/wordle/prompt", headers=h(owner, sid), timeout=30).status_code == 200
    message = inbox.message("call", sid, "duplicate-task-id", "guess", {"word": "zzzzz"}, 30, "nobody")
    cluster.redis.lpush(f"{cluster.prefix}:inbox:{runner}", message, message)
    key = f"{cluster.prefix}:result:duplicate-task-id"
    wait_until(lambda: cluster.redis.get(key), 10, "duplicate call result")
    r = httpx.post(f"{gateway.url}/wordle/call", headers=h(owner, sid), timeout=30,
                   json={"name": "guess", "input": {"word": "yyyyy"}})
    metadata = sse_result(r.text)["output"]["metadata"]
    assert metadata["turn"] == 2, json.dumps(metadata)  # one duplicate pair counted once, then this one


def test_no_live_runner_answers_503_with_retry_after(cluster, server_factory, owner):
    gateway = server_factory(**cluster.env())
    sid = httpx.post(f"{gateway.url}/create_session", headers=owner.headers).json()["sid"]
    r = httpx.post(f"{gateway.url}/create", headers=h(owner, sid), json={"split": "train", "index": 0})
    assert r.status_code == 503 and r.headers["Retry-After"] and "runner" in r.json()["detail"]
    assert not Session.objects.filter(sid=sid).exists()


def test_a_call_whose_gateway_died_is_recorded_from_the_runners_result(cluster, server_factory, owner):
    cluster.start_runner()
    cluster.start_platform_worker(ORS_SWEEP_EVERY_SECONDS="0.5", ORS_ORPHAN_AFTER_SECONDS="1")
    doomed = server_factory(**cluster.env())
    sid = open_session(doomed.url, owner, env="code", task_spec=code_task_with_sleep(0))

    def start_long_call() -> None:
        try:
            httpx.post(f"{doomed.url}/code/call", headers=h(owner, sid), timeout=30,
                       json={"name": "run", "input": {"code": SLEEPY.format(s=2)}})
        except httpx.TransportError:
            pass  # the gateway is killed under it

    thread = threading.Thread(target=start_long_call)
    thread.start()
    # The running calls' index, not a SCAN: a shared Redis may hold many keys of other runs.
    running = wait_until(lambda: cluster.redis.zrange(Keys(cluster.prefix).calls, 0, -1), 15, "call started")
    doomed.process.kill()
    thread.join(timeout=30)
    task_id = running[0].decode()
    call = wait_until(lambda: ToolCall.objects.filter(task_id=task_id).first(), 30, "recorded by the sweeper")
    assert call.status == "ok" and call.reward == 1.0 and call.name == "run"
    # And a surviving gateway serves the session and the reconnect.
    other = server_factory(**cluster.env())
    r = httpx.post(f"{other.url}/code/call", headers=h(owner, sid), json={"task_id": task_id}, timeout=30)
    assert sse_result(r.text)["output"]["reward"] == 1.0
