"""The tenant record and the bounded channel on the celery executor, with real processes (a gateway,
a runner node, its sandbox workers, Redis): team B's worker forges its audit copies, switches its
redaction off, floods and stalls its channel and returns huge outputs; the record is the one the
platform made, no secret is kept, logged or shown, and team A's episodes on the same node keep
scoring correctly."""

from __future__ import annotations

import json
import secrets

import httpx
import pytest
from django.core import serializers

from orsplatform.catalog.services import environment_publish
from orsplatform.episodes.models import Session, ToolCall
from tests.executors.noisy import write_noisy
from tests.executors.test_hostile_tenants_celery import TeamAThread, open_session, secret_header
from tests.fixtures.ors import parse_sse, sse_result
from tests.ors.support import publish_probe_sync

pytestmark = pytest.mark.e2e
NOISY = "globex/noisy"


def canary() -> str:
    return "sbxcanary-" + secrets.token_hex(8)


@pytest.fixture
def published(owner, outsider, tmp_path) -> str:
    write_noisy(tmp_path / "noisy")
    environment_publish(team=outsider.team, source_dir=tmp_path / "noisy")
    return publish_probe_sync(owner.team, tmp_path / "a")


def call(base: str, person, sid: str, name: str, **params) -> tuple[dict | None, str | None]:
    r = httpx.post(f"{base}/{NOISY}/call", headers={**person.headers, "X-Session-ID": sid},
                   json={"name": name, "input": params}, timeout=120)
    assert r.status_code == 200, r.text
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    return (None, errors[0]) if errors else (sse_result(r.text), None)


def runner_log(cluster, hostname: str) -> str:
    return (cluster.tmp / f"{hostname.partition('@')[0]}.log").read_text(errors="replace")


def test_on_a_runner_node_the_record_is_the_platforms_and_no_secret_is_kept_logged_or_shown(
        cluster, server_factory, owner, outsider, published):
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    secret = canary()
    with TeamAThread(base, owner, published) as team_a:
        sid = open_session(base, outsider, NOISY, secret)
        result, _ = call(base, outsider, sid, "forge_and_reveal", n=3)
        assert result["output"]["reward"] == 0.0 and secret in result["output"]["blocks"][0]["text"]
        result, _ = call(base, outsider, sid, "count", n=4)
        assert result["output"]["reward"] == 0.5
        _, error = call(base, outsider, sid, "explode", n=5)
        assert "bad key" in error and secret not in error

        headers = {**outsider.headers, **secret_header(secret)}
        failed = httpx.post(f"{base}/create_session", headers=headers).json()["sid"]
        r = httpx.post(f"{base}/{NOISY}/create", headers={**headers, "X-Session-ID": failed},
                       json={"task_spec": {"id": 0, "fail_setup": True}}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.get(f"{base}/{NOISY}/prompt", headers={**outsider.headers, "X-Session-ID": failed}, timeout=60)
        assert r.status_code == 500 and "cannot start with key" in r.text and secret not in r.text
        team_a.check(at_least=team_a.episodes + 2)

    rows = {c.name: c for c in ToolCall.objects.filter(session__sid=sid)}
    assert rows["forge_and_reveal"].reward == 0.0 and rows["forge_and_reveal"].input == {"n": 3}
    assert rows["forge_and_reveal"].output["output"]["blocks"][0]["text"] == "the key is [redacted]"
    assert rows["count"].reward == 0.5 and rows["count"].input == {"n": 4}
    assert "bad key [redacted]" in rows["explode"].error
    assert "cannot start with key [redacted]" in Session.objects.get(sid=failed).error
    assert all(c.reward == 0.5 for c in ToolCall.objects.filter(name="count"))

    for shown in (sid, failed):
        r = httpx.get(f"{base}/api/v1/sessions/{shown}", headers=outsider.headers, timeout=30)
        assert r.status_code == 200 and secret not in r.text, r.text
    stored = serializers.serialize("json", [*Session.objects.all(), *ToolCall.objects.all()])
    assert secret not in stored and "forged" not in stored
    assert secret not in gateway.log() and secret not in runner_log(cluster, runner)


def test_on_a_runner_node_floods_stalls_and_huge_outputs_stay_within_the_channels_bounds(
        cluster, server_factory, owner, outsider, published, monkeypatch):
    monkeypatch.setenv("ORS_FRAME_DEADLINE_SECONDS", "2")
    monkeypatch.setenv("ORS_MAX_TOOL_OUTPUT_BYTES", str(1 << 20))
    monkeypatch.setenv("ORS_AUDIT_TRUNCATED_BYTES", "4096")
    runner = cluster.start_runner()
    gateway = server_factory(**cluster.env())
    base = gateway.url
    runner_pid = cluster.heartbeat_pid(runner)
    secret = canary()
    with TeamAThread(base, owner, published) as team_a:
        sid = open_session(base, outsider, NOISY, secret)
        result, _ = call(base, outsider, sid, "huge", size=3 << 20)
        assert result["ok"] is False and result["reason"] == "output_too_large", result
        result, _ = call(base, outsider, sid, "count", n=1)  # the worker carries on
        assert result["output"]["reward"] == 0.5

        _, error = call(base, outsider, sid, "flood", n=200, size=64 * 1024)
        assert "globex/noisy@1" in error and "answers no request" in error, error

        stalled = open_session(base, outsider, NOISY)  # a fresh worker
        _, error = call(base, outsider, stalled, "partial", size=1 << 20)
        assert "did not arrive whole within 2 s" in error, error
        team_a.check(at_least=team_a.episodes + 2)
    assert cluster.heartbeat_pid(runner) == runner_pid  # the node itself never went down

    over = ToolCall.objects.filter(session__sid=sid).order_by("id").first()
    assert over.status == "error" and "ORS_MAX_TOOL_OUTPUT_BYTES" in over.error
    kept = over.output["truncated_output"]
    assert kept.startswith('{"id":') and len(kept.encode()) <= 4096 and secret not in kept
    assert secret not in json.dumps(over.output)
