"""Faults and boundaries of the celery executor, with real processes."""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid

import httpx
import pytest
from django.test import Client

from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.executors.keys import runner_hostname
from tests.fixtures.celery import Cluster, wait_until
from tests.fixtures.ors import parse_sse, sse_result

pytestmark = pytest.mark.e2e

PROBE = textwrap.dedent('''
    import asyncio
    import os
    import sys

    from pydantic import BaseModel
    from ors import Environment, Split, TextBlock, ToolOutput, tool

    class Nap(BaseModel):
        seconds: float

    class Probe(Environment):
        def __init__(self, task_spec=None, secrets=None):
            super().__init__(task_spec or {}, secrets or {})
            self.token = (secrets or {}).get("token", "")

        @classmethod
        def list_splits(cls):
            return [Split(name="train", type="train")]

        @classmethod
        def list_tasks(cls, split):
            return [{"id": 0}]

        def setup(self):
            if self.task_spec.get("fail_setup"):
                raise RuntimeError("setup refused")
            if self.task_spec.get("slow_setup"):
                import time
                time.sleep(self.task_spec["slow_setup"])

        def list_task_tools(self):  # a request this node answers far too late
            import time
            time.sleep(3)
            raise RuntimeError("too late anyway")

        def get_prompt(self):  # careless too: a prompt that shows the secret
            return [TextBlock(text=f"probe {self.token}".strip())]

        @tool
        async def nap(self, params: Nap) -> ToolOutput:
            """Sleeps."""
            await asyncio.sleep(params.seconds)
            return ToolOutput(blocks=[TextBlock(text="rested")], reward=1.0)

        @tool
        def doze(self, params: Nap) -> ToolOutput:
            """Sleeps in its thread (a sync tool)."""
            import time
            time.sleep(params.seconds)
            return ToolOutput(blocks=[TextBlock(text="dozed")], reward=1.0)

        @tool
        def odd_reward(self) -> ToolOutput:
            """A reward JSON has no number for."""
            return ToolOutput(blocks=[TextBlock(text="nan")], reward=float("nan"))

        @tool
        def garbled(self) -> ToolOutput:
            """Text no JSON encoder accepts (a lone surrogate)."""
            return ToolOutput(blocks=[TextBlock(text="\\ud800")])

        @tool
        def reveal(self) -> ToolOutput:
            """Echoes the session's secret, as careless environment code might."""
            return ToolOutput(blocks=[TextBlock(text="token=" + self.token)])

        @tool
        def surroundings(self) -> ToolOutput:
            """What this process can see of the platform."""
            seen = {"env": sorted(os.environ), "django_loaded": "django.conf" in sys.modules}
            try:
                from django.conf import settings
                seen["secret_key"] = bool(settings.SECRET_KEY)
            except Exception as exc:
                seen["secret_key_error"] = type(exc).__name__
            return ToolOutput(blocks=[TextBlock(text="ok")], metadata=seen)
''')


@pytest.fixture
def probe(owner, tmp_path):
    package = tmp_path / "probe-pkg"
    package.mkdir()
    (package / "env.py").write_text(PROBE)
    (package / "manifest.toml").write_text(
        'name = "probe"\nentrypoint = "env:Probe"\nvisibility = "private"\ntool_timeout_seconds = 1\n')
    environment_publish(team=owner.team, source_dir=package)
    return "acme/probe"


def open_session(base: str, person, env: str) -> str:
    sid = httpx.post(f"{base}/create_session", headers=person.headers).json()["sid"]
    r = httpx.post(f"{base}/{env}/create", headers={**person.headers, "X-Session-ID": sid},
                   json={"split": "train", "index": 0}, timeout=30)
    assert r.status_code == 200, r.text
    return sid


def call(base: str, person, sid: str, env: str, name: str, tool_input: dict, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{base}/{env}/call", headers={**person.headers, "X-Session-ID": sid},
                      json={"name": name, "input": tool_input}, timeout=timeout)


def test_a_tool_over_its_timeout_answers_a_timeout_and_the_session_stays_usable(cluster, server_factory, owner, probe):
    cluster.start_runner()
    gateway = server_factory(**cluster.env())
    sid = open_session(gateway.url, owner, probe)
    for tool in ("nap", "doze"):  # async, and sync in the node's thread pool
        result = sse_result(call(gateway.url, owner, sid, probe, tool, {"seconds": 3}).text)
        assert result["ok"] is False and result["reason"] == "timeout"
        result = sse_result(call(gateway.url, owner, sid, probe, "nap", {"seconds": 0}).text)
        assert result["ok"] is True and result["output"]["reward"] == 1.0


def test_results_json_cannot_carry_end_as_on_the_inline_executor_and_the_gateway_keeps_listening(
        cluster, server_factory, owner, probe):
    cluster.start_runner()
    # Polling so slow that an answer found by polling instead of the channel's wake-up shows.
    gateway = server_factory(**cluster.env(ORS_RUNNER_POLL_SECONDS="5"))
    sid = open_session(gateway.url, owner, probe)

    def timed(name: str) -> tuple[str, float]:
        started = time.monotonic()
        text = call(gateway.url, owner, sid, probe, name, {} if name != "nap" else {"seconds": 0}).text
        return text, time.monotonic() - started

    text, took = timed("odd_reward")
    result = sse_result(text)
    assert result["ok"] is True and result["output"]["reward"] is None  # NaN: null, as orjson writes it
    assert took < 3
    text, took = timed("garbled")
    events = parse_sse(text)
    assert events[-1][0] == "error" and "not valid JSON" in events[-1][1] and took < 3
    text, took = timed("nap")
    assert sse_result(text)["ok"] is True and took < 3, "the gateway still listens on its channel"
    assert list(ToolCall.objects.filter(session__sid=sid).order_by("started_at").values_list("status", flat=True)) == [
        "ok", "error", "ok"]


def test_a_failed_setup_is_reported_and_frees_its_place_on_the_runner(cluster, server_factory, owner, probe):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    sid = httpx.post(f"{gateway.url}/create_session", headers=owner.headers).json()["sid"]
    r = httpx.post(f"{gateway.url}/{probe}/create", headers={**owner.headers, "X-Session-ID": sid},
                   json={"task_spec": {"fail_setup": True}}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.get(f"{gateway.url}/{probe}/prompt", headers={**owner.headers, "X-Session-ID": sid}, timeout=30)
    assert r.status_code == 500 and "setup refused" in r.json()["detail"]
    after = time.time() + 0.5  # a heartbeat period after the failure was reported
    wait_until(lambda: Session.objects.get(sid=sid).status == "failed", 10, "session marked failed")
    beat = wait_until(lambda: cluster.heartbeat(runner).get("at", 0) > after and cluster.heartbeat(runner),
                      10, "a heartbeat written after the failure")
    assert beat["sessions"] == 0, "the runner let the instance go"


def test_a_request_its_runner_does_not_answer_in_time_answers_503_and_the_session_stays_usable(
        cluster, server_factory, owner, probe):
    cluster.start_runner()
    gateway = server_factory(**cluster.env(ORS_RUNNER_REPLY_TIMEOUT_SECONDS="1"))
    sid = open_session(gateway.url, owner, probe)
    r = httpx.get(f"{gateway.url}/{probe}/task_tools", headers={**owner.headers, "X-Session-ID": sid}, timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] and "did not answer" in r.json()["detail"]
    assert sse_result(call(gateway.url, owner, sid, probe, "nap", {"seconds": 0}).text)["ok"]


def test_a_runner_lost_during_setup_answers_410_saying_so(cluster, server_factory, owner, probe):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env(ORS_SETUP_WAIT_SECONDS="30"))
    sid = httpx.post(f"{gateway.url}/create_session", headers=owner.headers).json()["sid"]
    r = httpx.post(f"{gateway.url}/{probe}/create", headers={**owner.headers, "X-Session-ID": sid},
                   json={"task_spec": {"slow_setup": 60}}, timeout=30)
    assert r.status_code == 200, r.text
    wait_until(lambda: cluster.heartbeat(runner).get("sessions") == 1, 10, "setup running on the runner")
    cluster.kill_runner(runner)
    r = httpx.get(f"{gateway.url}/{probe}/prompt", headers={**owner.headers, "X-Session-ID": sid}, timeout=60)
    assert r.status_code == 410 and "runner" in r.json()["detail"] and "stopped" in r.json()["detail"]


def test_a_runner_that_never_answers_ends_the_call_with_an_error_within_the_bound(cluster, server_factory, owner, probe):
    runner = cluster.start_runner()
    cluster.start_platform_worker()
    gateway = server_factory(**cluster.env())
    sid = open_session(gateway.url, owner, probe)
    assert call(gateway.url, owner, sid, probe, "nap", {"seconds": 0}).status_code == 200
    events: list = []
    thread = threading.Thread(target=lambda: events.extend(
        parse_sse(call(gateway.url, owner, sid, probe, "nap", {"seconds": 0.9}, timeout=60).text)))
    cluster.freeze_runner(runner)
    frozen_at = time.monotonic()
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert time.monotonic() - frozen_at < 15
    assert [e for e, _ in events if e != ":"][-1] == "error"
    wait_until(lambda: Session.objects.get(sid=sid).status == "lost", 20, "session marked lost")


def test_a_teams_dedicated_runners_take_only_its_sessions(cluster, server_factory, owner, outsider):
    shared = cluster.start_runner()
    dedicated = cluster.start_runner(team="acme")
    gateway = server_factory(**cluster.env())
    mine = [open_session(gateway.url, owner, "math") for _ in range(3)]
    theirs = [open_session(gateway.url, outsider, "math") for _ in range(3)]
    assert {runner_hostname(Session.objects.get(sid=s).runner) for s in mine} == {dedicated}
    assert {runner_hostname(Session.objects.get(sid=s).runner) for s in theirs} == {shared}


def test_runner_nodes_hold_no_platform_credentials(cluster, server_factory, owner, probe):
    cluster.start_runner()
    gateway = server_factory(**cluster.env(SECRET_KEY="platform-secret-key-canary", ALLOWED_HOSTS="127.0.0.1"))
    sid = open_session(gateway.url, owner, probe)
    seen = sse_result(call(gateway.url, owner, sid, probe, "surroundings", {}).text)["output"]["metadata"]
    assert not {"DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"} & set(seen["env"])
    assert "secret_key" not in seen  # Django settings are not configured in a runner


def test_a_secret_echoed_through_another_gateway_is_kept_out_of_the_audit_log(cluster, server_factory, owner,
                                                                              probe):
    cluster.start_runner()
    a = server_factory(**cluster.env())
    b = server_factory(**cluster.env())
    secret = "canary-" + uuid.uuid4().hex
    sid = httpx.post(f"{a.url}/create_session", headers=owner.headers).json()["sid"]
    r = httpx.post(f"{a.url}/{probe}/create", headers={**owner.headers, "X-Session-ID": sid},
                   json={"split": "train", "index": 0, "secrets": {"token": secret}}, timeout=30)
    assert r.status_code == 200, r.text
    # Gateway B never saw the secrets (they live on the runner): the runner strips them from the
    # audit copy; the client still gets the result exactly as the environment produced it.
    result = sse_result(call(b.url, owner, sid, probe, "reveal", {}).text)
    assert result.get("ok"), result
    assert result["output"]["blocks"][0]["text"] == f"token={secret}"
    row = ToolCall.objects.get(session__sid=sid, name="reveal")
    assert secret not in json.dumps(row.output) and "[redacted]" in json.dumps(row.output)
    # The same for what the client sends (an input that quotes the secret) and the prompt.
    sse_result(call(b.url, owner, sid, probe, "nap", {"seconds": 0, "note": secret}).text)
    row = ToolCall.objects.get(session__sid=sid, name="nap")
    assert secret not in json.dumps(row.input) and "[redacted]" in json.dumps(row.input)
    r = httpx.get(f"{b.url}/{probe}/prompt", headers={**owner.headers, "X-Session-ID": sid}, timeout=30)
    assert r.json()[0]["text"] == f"probe {secret}"
    wait_until(lambda: Session.objects.get(sid=sid).prompt, 10, "prompt recorded")
    prompt = json.dumps(Session.objects.get(sid=sid).prompt)
    assert secret not in prompt and "[redacted]" in prompt


def test_a_session_deleted_through_another_gateway_is_torn_down_on_its_runner(cluster, server_factory, owner):
    runner = cluster.start_runner()
    a = server_factory(**cluster.env())
    b = server_factory(**cluster.env())
    sid = open_session(a.url, owner, "math")

    def held() -> int:
        return json.loads(cluster.redis.get(f"{cluster.prefix}:runner:{runner}") or b"{}").get("sessions", -1)

    wait_until(lambda: held() == 1, 10, "the runner reports the session")
    # B never served the session before: it learns of it from its record and ends it on the runner.
    assert httpx.post(f"{b.url}/delete", headers={**owner.headers, "X-Session-ID": sid}).status_code == 200
    wait_until(lambda: held() == 0, 10, "the runner tore the instance down")
    assert Session.objects.get(sid=sid).status == "deleted"
    r = httpx.get(f"{b.url}/math/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 410 and "detail" in r.json()
    wait_until(lambda: httpx.get(f"{a.url}/math/prompt", headers={**owner.headers, "X-Session-ID": sid}
                                 ).status_code == 410, 10, "410 on A once its copy is re-checked")


def test_a_broker_restart_fails_requests_fast_and_recovers_without_a_restart(live_db, tmp_path, private_redis,
                                                                               server_factory, owner):
    cluster = Cluster(tmp=tmp_path, redis_url=private_redis.url)
    try:
        cluster.start_runner()
        gateway = server_factory(**cluster.env())
        sid = open_session(gateway.url, owner, "math")
        assert sse_result(call(gateway.url, owner, sid, "math", "submit", {"answer": "1"}).text)["ok"]

        private_redis.stop()
        started = time.monotonic()
        new_sid = httpx.post(f"{gateway.url}/create_session", headers=owner.headers).json()["sid"]
        r = httpx.post(f"{gateway.url}/math/create", headers={**owner.headers, "X-Session-ID": new_sid},
                       json={"split": "train", "index": 1}, timeout=30)
        assert r.status_code == 503 and "Retry-After" in r.headers, r.text
        assert time.monotonic() - started < 10
        assert not Session.objects.filter(sid=new_sid).exists()

        private_redis.start()  # same port, empty: the runner and the gateway reconnect by themselves

        def create_works() -> bool:
            r = httpx.post(f"{gateway.url}/math/create", headers={**owner.headers, "X-Session-ID": new_sid},
                           json={"split": "train", "index": 1}, timeout=30)
            return r.status_code == 200

        wait_until(create_works, 60, "create works again after the broker came back", interval=0.5)
        r = call(gateway.url, owner, new_sid, "math", "submit", {"answer": "1"})
        assert sse_result(r.text)["ok"]
        assert ToolCall.objects.filter(session__sid=new_sid).count() == 1
    finally:
        cluster.stop()


def test_readiness_requires_a_live_runner_with_the_celery_executor(cluster, settings):
    settings.ORS_EXECUTOR = "celery"
    settings.REDIS_URL = settings.CELERY_BROKER_URL = cluster.redis_url
    settings.ORS_REDIS_PREFIX = cluster.prefix
    r = Client().get("/ready")
    assert r.status_code == 503 and r.json()["runners"] == "none"
    cluster.start_runner()
    r = Client().get("/ready")
    assert r.status_code == 200 and r.json() == {
        "status": "ok", "database": "ok", "redis": "ok", "broker": "ok", "runners": "1 live"}


def test_readiness_checks_a_broker_other_than_redis(cluster, settings):
    cluster.start_runner()
    settings.ORS_EXECUTOR = "celery"
    settings.REDIS_URL = cluster.redis_url
    settings.ORS_REDIS_PREFIX = cluster.prefix
    settings.CELERY_BROKER_URL = cluster.redis_url.rsplit("/", 1)[0] + "/1"  # another database: checked apart
    r = Client().get("/ready")
    assert r.status_code == 200 and r.json()["broker"] == "ok"
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens there
    r = Client().get("/ready")
    assert r.status_code == 503 and r.json()["broker"] == "down" and r.json()["redis"] == "ok"
