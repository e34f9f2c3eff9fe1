"""What a gateway keeps per open session stays O(what is active): awaited calls are not kept once
finished, lingering results expire from the front of one queue, and the Redis lease of every open
session is renewed in one command per team."""

from __future__ import annotations

import gc
import time

import orjson
import pytest
import redis
from django.conf import settings

from orsplatform.engine.limits import SLOT_LEASE_SECONDS, Limits
from orsplatform.engine.live import FINISHED
from orsplatform.executors.keys import Keys
from orsplatform.teams.auth import Access
from tests.fixtures.ors import parse_sse, start_episode
from tests.ors.support import acalls, sid_headers


async def test_a_call_awaited_whole_is_not_kept_once_finished_but_a_streamed_one_lingers(client, owner, ors_app):
    sid = await start_episode(client, owner.headers, split="test", index=0)
    gateway = ors_app.gateway
    live = gateway.sessions[sid]
    caller = await gateway.authorize(owner.token, Access.SESSIONS)
    entry = await gateway.call(caller, live, "submit", {"answer": "no"})  # as the OpenEnv face steps
    assert entry.done.is_set() and entry.outcome()[0]["ok"] is True
    assert live.calls == {}  # nothing reconnects to it: gone once answered
    assert len(await acalls(sid)) == 1  # and recorded like any other

    streamed = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "no"}})
    task_id = parse_sse(streamed.text)[0][1]
    assert list(live.calls) == [task_id]  # an ORS stream's result is kept for a reconnect


async def test_a_lingering_result_is_kept_as_its_json_alone_and_a_reconnect_still_reads_it(client, owner, ors_app):
    sid = await start_episode(client, owner.headers, split="test", index=0)
    r = await client.post("/math/call", headers=sid_headers(owner, sid), json={"name": "submit", "input": {"answer": "no"}})
    task_id = parse_sse(r.text)[0][1]
    entry = ors_app.gateway.sessions[sid].calls[task_id]
    # What the collector would walk per lingering call: the entry itself (slots, no __dict__),
    # and no result dicts, task or per-call Event (a shared, already-set one instead).
    assert not hasattr(entry, "__dict__") and entry.result is None and isinstance(entry.encoded, bytes)
    assert entry.done is FINISHED and not gc.get_referents(entry.encoded)
    assert [o for o in gc.get_referents(entry) if gc.is_tracked(o) and o not in (FINISHED, type(entry))] == []
    result, error = entry.outcome()
    assert error is None and result["ok"] is True and orjson.dumps(result) == entry.encoded
    again = await client.post("/math/call", headers=sid_headers(owner, sid), json={"task_id": task_id})
    assert parse_sse(again.text) == parse_sse(r.text)  # the reconnect by task id answers the same events


async def test_the_reaper_expires_lingering_results_oldest_first(client, owner, member, ors_app, settings):
    sids = [await start_episode(client, p.headers, split="test", index=0) for p in (owner, member)]
    for person, sid in zip((owner, member), sids, strict=True):
        r = await client.post("/math/call", headers=sid_headers(person, sid), json={"name": "submit", "input": {"answer": "no"}})
        assert r.status_code == 200
    gateway = ors_app.gateway
    runner = gateway.calls
    assert len(runner.lingering) == 2
    oldest_at = runner.lingering[0][0]
    runner.expire(oldest_at + 10, linger=10.0)  # nothing older than the linger yet
    assert [len(gateway.sessions[s].calls) for s in sids] == [1, 1]
    runner.expire(runner.lingering[1][0] + 0.0001, linger=0.0)
    assert [len(gateway.sessions[s].calls) for s in sids] == [0, 0] and not runner.lingering


@pytest.fixture
def redis_url(settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/3"
    return settings.REDIS_URL


async def test_renewing_vouches_for_each_teams_own_open_sessions_only(redis_url, owner, outsider):
    limits = Limits()
    keys = Keys(settings.ORS_REDIS_PREFIX)
    sync = redis.Redis.from_url(redis_url)
    try:
        ours = [f"sid-{n}" for n in range(2500)]  # more than one command's worth
        for sid in ours:
            assert await limits.acquire_session(owner.team.pk, sid, 10_000)
        assert await limits.acquire_session(outsider.team.pk, "theirs", 10)
        stale = time.time() - SLOT_LEASE_SECONDS / 2
        sync.zadd(keys.slots(owner.team.pk), {sid: stale for sid in ours})
        sync.zadd(keys.slots(outsider.team.pk), {"theirs": stale})

        await limits.renew([(owner.team.pk, sid) for sid in ours] + [(outsider.team.pk, "gone-elsewhere")])

        scores = dict(sync.zrange(keys.slots(owner.team.pk), 0, -1, withscores=True))
        assert len(scores) == 2500 and min(scores.values()) > stale + 1
        # The other team's slots: its own session untouched, and a released one not brought back.
        assert sync.zrange(keys.slots(outsider.team.pk), 0, -1, withscores=True) == [(b"theirs", stale)]
    finally:
        sync.delete(keys.slots(owner.team.pk), keys.slots(outsider.team.pk))
        sync.close()
        await limits.close()
