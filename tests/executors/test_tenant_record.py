"""The gateway owns the record, and the channel to a sandbox worker is bounded (issue #23, findings
3 and 5), on the inline executor with real sandbox workers: team B (globex) runs an environment
that rewrites its worker's replies, switches its redaction off, floods the channel, starts a frame
it never finishes and returns huge outputs, while team A's (acme) concurrent episodes keep scoring
correctly."""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import time

import httpx
import pytest
from django.conf import settings

from orsplatform.asgi import build_application
from orsplatform.engine.gateway import EpisodeGateway
from orsplatform.episodes.models import Session, ToolCall
from orsplatform.executors.inline import InlineExecutor
from orsplatform.ors.app import OrsApp
from orsplatform.sandbox.config import SandboxConfig
from tests.executors.noisy import write_noisy
from tests.executors.test_hostile_tenants import TeamA, open_session, secret_header
from tests.fixtures.ors import parse_sse, sse_result
from tests.ors.support import acalls, arow, in_db, publish_probe_sync, sid_headers

NOISY = "globex/noisy"


def canary() -> str:
    return "sbxcanary-" + secrets.token_hex(8)


@pytest.fixture
async def sbx(live_db):
    config = dataclasses.replace(SandboxConfig.from_settings(settings, threads=8), idle_seconds=1.0, grace_seconds=1.0)
    app = OrsApp(gateway=EpisodeGateway(executor=InlineExecutor(threads=8, config=config)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_application(app)),
                                 base_url="http://testserver", timeout=60) as client:
        client.ors_app = app
        yield client
    await app.shutdown()


@pytest.fixture
async def noisy(outsider, tmp_path):
    from orsplatform.catalog.services import environment_publish

    write_noisy(tmp_path / "noisy")
    await in_db(lambda: environment_publish(team=outsider.team, source_dir=tmp_path / "noisy"))
    return NOISY


@pytest.fixture
async def probe_a(owner, tmp_path):
    return await in_db(publish_probe_sync, owner.team, tmp_path / "a")


async def call(client, person, sid: str, name: str, **params) -> tuple[dict | None, str | None]:
    """(the result, None) or (None, the error event's text) of one call."""
    r = await client.post(f"/{NOISY}/call", headers=sid_headers(person, sid), json={"name": name, "input": params})
    assert r.status_code == 200, r.text
    errors = [d for e, d in parse_sse(r.text) if e == "error"]
    return (None, errors[0]) if errors else (sse_result(r.text), None)


def everything_stored() -> str:
    from django.core import serializers

    return serializers.serialize("json", [*Session.objects.all(), *ToolCall.objects.all()])


async def test_forged_audit_copies_are_ignored_and_secrets_are_stripped_from_all_that_is_kept_or_shown(
        sbx, owner, outsider, noisy, probe_a, caplog):
    caplog.set_level(logging.DEBUG)
    secret = canary()
    with TeamA(sbx, owner, probe_a) as team_a:
        sid = await open_session(sbx, outsider, NOISY, secret)
        result, _ = await call(sbx, outsider, sid, "forge_and_reveal", n=3)
        assert result["output"]["reward"] == 0.0
        assert secret in result["output"]["blocks"][0]["text"]  # the caller gets what its environment said
        result, _ = await call(sbx, outsider, sid, "count", n=4)  # its worker forges every reply from now on
        assert result["output"]["reward"] == 0.5
        _, error = await call(sbx, outsider, sid, "explode", n=5)
        assert "bad key" in error and secret not in error

        # A setup failure carrying the secret, with the worker's redaction switched off.
        failed = await open_failed_session(sbx, outsider, secret)
        r = await sbx.get(f"/{NOISY}/prompt", headers=sid_headers(outsider, failed))
        assert r.status_code == 500 and "cannot start with key" in r.text and secret not in r.text
        await team_a.check(at_least=2)

    rows = {c["name"]: c for c in await acalls(sid)}
    # The record is what the agent was sent (reward 0.0, the input it sent), never the worker's copy.
    assert rows["forge_and_reveal"]["reward"] == 0.0 and rows["forge_and_reveal"]["input"] == {"n": 3}
    assert rows["forge_and_reveal"]["output"]["output"]["blocks"][0]["text"] == "the key is [redacted]"
    assert rows["count"]["reward"] == 0.5 and rows["count"]["input"] == {"n": 4}
    assert rows["explode"]["status"] == "error" and "bad key [redacted]" in rows["explode"]["error"]
    assert "cannot start with key [redacted]" in (await arow(failed))["error"]
    assert all(c["reward"] == 0.5 for c in await acalls() if c["name"] == "count")  # team A's too

    for shown in (sid, failed):
        r = await sbx.get(f"/api/v1/sessions/{shown}", headers=outsider.headers)
        assert r.status_code == 200 and secret not in r.text, r.text
    assert "forged" not in json.dumps(rows, default=str)
    assert secret not in await in_db(everything_stored)
    assert "setup failed" in caplog.text and secret not in caplog.text


async def open_failed_session(client, person, secret: str) -> str:
    headers = {**person.headers, **secret_header({"api_key": secret})}
    sid = (await client.post("/create_session", headers=headers)).json()["sid"]
    r = await client.post(f"/{NOISY}/create", headers={**headers, "X-Session-ID": sid},
                          json={"task_spec": {"id": 0, "fail_setup": True}})
    assert r.status_code == 200, r.text
    return sid


# Small frames (parsed) and 16 MiB ones (the flood: past the output cap, under the frame
# cap, so never read whole but discarded as they come).
@pytest.mark.parametrize(("n", "size"), [(200, 64 * 1024), (4, 16 * 1024 * 1024)])
async def test_frames_that_answer_no_request_kill_the_worker_and_only_its_sessions(
        sbx, owner, outsider, noisy, probe_a, n, size):
    with TeamA(sbx, owner, probe_a) as team_a:
        sid = await open_session(sbx, outsider, NOISY)
        sibling = await open_session(sbx, outsider, NOISY)  # the same worker
        _, error = await call(sbx, outsider, sid, "flood", n=n, size=size)
        assert "globex/noisy@1" in error and "answers no request" in error, error
        r = await sbx.get(f"/{NOISY}/prompt", headers=sid_headers(outsider, sibling))
        assert r.status_code == 410 and "answers no request" in r.text
        fresh = await open_session(sbx, outsider, NOISY)  # a new worker for the next session
        result, _ = await call(sbx, outsider, fresh, "count", n=2)
        assert result["output"]["blocks"][0]["text"] == "4"
        await team_a.check(at_least=2)


async def test_a_pair_whose_workers_keep_breaking_the_channel_waits_longer_for_each_new_worker(
        sbx, owner, outsider, noisy, probe_a):
    pool = sbx.ors_app.gateway.executor.pool
    with TeamA(sbx, owner, probe_a) as team_a:
        delays, opened_in = [], []
        for _ in range(3):
            started = time.monotonic()
            sid = await open_session(sbx, outsider, NOISY)
            opened_in.append(time.monotonic() - started)
            _, error = await call(sbx, outsider, sid, "flood", n=200, size=64 * 1024)
            assert "answers no request" in error, error
            (key,) = [k for k in pool._backoff if k[1] == outsider.team.pk]
            delays.append(pool._backoff[key][1])
        assert delays == [0.5, 1.0, 2.0]
        # The third worker waited out the second fault's back-off before it started.
        assert opened_in[2] >= 1.0, opened_in
        # Another team's pair never waits.
        assert not [k for k in pool._backoff if k[1] != outsider.team.pk]
        await team_a.check(at_least=2)


async def test_a_frame_that_never_ends_kills_the_worker_once_the_deadline_passes(
        sbx, owner, outsider, noisy, probe_a, settings):
    settings.ORS_FRAME_DEADLINE_SECONDS = 2.0
    with TeamA(sbx, owner, probe_a) as team_a:
        sid = await open_session(sbx, outsider, NOISY)
        started = time.monotonic()
        _, error = await call(sbx, outsider, sid, "partial", size=1 << 20)
        # Killed at the frame deadline, long before the tool's own 30 s timeout.
        assert "did not arrive whole within 2 s" in error, error
        assert time.monotonic() - started < 20
        await team_a.check(at_least=2)


async def test_an_oversized_output_ends_the_call_with_a_clear_error_and_a_truncated_audit_copy(
        sbx, owner, outsider, noisy, probe_a, settings):
    settings.ORS_MAX_TOOL_OUTPUT_BYTES = 1 << 20
    settings.ORS_AUDIT_TRUNCATED_BYTES = 4096
    settings.ORS_MAX_FRAME_BYTES = 8 << 20
    secret = canary()
    with TeamA(sbx, owner, probe_a) as team_a:
        sid = await open_session(sbx, outsider, NOISY, secret)
        result, _ = await call(sbx, outsider, sid, "huge", size=3 << 20)
        assert result["ok"] is False and result["reason"] == "output_too_large", result
        assert "ORS_MAX_TOOL_OUTPUT_BYTES" in result["error"] and "truncated_output" not in result
        # The worker carries on: an answer within the limit is taken as before.
        result, _ = await call(sbx, outsider, sid, "huge", size=512 * 1024)
        assert result["ok"] is True and len(result["output"]["blocks"][0]["text"]) == 512 * 1024
        # Over the protocol's frame limit: that is no answer at all, and the worker is killed.
        _, error = await call(sbx, outsider, sid, "huge", size=12 << 20)
        assert "larger than the protocol allows" in error, error
        await team_a.check(at_least=2)

    rows = await acalls(sid)
    over = rows[0]
    assert over["status"] == "error" and "ORS_MAX_TOOL_OUTPUT_BYTES" in over["error"]
    kept = over["output"]["truncated_output"]
    assert kept.startswith('{"id":') and 0 < len(kept.encode()) <= 4096
    assert secret not in kept and "[redacted]" in kept
    assert rows[1]["status"] == "ok"


def test_a_truncated_copy_keeps_no_piece_of_a_secret_cut_at_its_end():
    from orsplatform.sandbox.redact import redact_head, secret_values

    secret = 'sbx"canary-1234'
    values = secret_values({"api_key": secret})
    # Whole, JSON-escaped (as an answer's raw text spells it), and cut by the truncation.
    assert redact_head('{"text":"sbx\\"canary-1234 and sbx\\"can', values) == '{"text":"[redacted] and '
    assert redact_head("plain sbx\"canary-1234 then sbx\"c", values) == "plain [redacted] then "
    assert redact_head("nothing to hide", values) == "nothing to hide"
