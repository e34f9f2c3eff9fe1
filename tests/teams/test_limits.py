"""Per-team limits through the ORS surface (in process; shared through Redis when REDIS_URL is set,
as on CI)."""

import asyncio

from asgiref.sync import sync_to_async

from orsplatform.teams.auth import key_cache
from orsplatform.teams.models import Team
from tests.fixtures.ors import sse_result, start_episode


async def set_limits(team, **limits) -> None:
    await sync_to_async(lambda: Team.objects.filter(pk=team.pk).update(**limits))()
    key_cache.clear()


async def test_the_session_over_the_limit_gets_429_and_a_freed_slot_works_at_once(client, owner, member):
    await set_limits(owner.team, max_open_sessions=2)
    first = await start_episode(client, owner.headers)
    await start_episode(client, member.headers)  # the limit is the team's, across its keys
    sid = (await client.post("/create_session", headers=owner.headers)).json()["sid"]
    r = await client.post("/create", headers={**owner.headers, "X-Session-ID": sid}, json={"split": "train", "index": 1})
    assert r.status_code == 429
    assert "maximum capacity" in r.json()["detail"] and int(r.headers["Retry-After"]) > 0
    await client.post("/delete", headers={**owner.headers, "X-Session-ID": first})
    r = await client.post("/create", headers={**owner.headers, "X-Session-ID": sid}, json={"split": "train", "index": 1})
    assert r.status_code == 200


async def test_concurrent_creates_never_exceed_the_limit(client, owner):
    await set_limits(owner.team, max_open_sessions=3)
    sids = [(await client.post("/create_session", headers=owner.headers)).json()["sid"] for _ in range(8)]
    responses = await asyncio.gather(*[
        client.post("/create", headers={**owner.headers, "X-Session-ID": sid}, json={"split": "train", "index": i})
        for i, sid in enumerate(sids)
    ])
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 3 + [429] * 5


async def test_another_team_is_not_limited_by_a_full_team(client, owner, outsider):
    await set_limits(owner.team, max_open_sessions=1)
    await start_episode(client, owner.headers)
    await start_episode(client, outsider.headers)


async def test_tool_calls_over_the_rate_get_429(client, owner):
    await set_limits(owner.team, max_tool_calls_per_second=2)
    sid = await start_episode(client, owner.headers, env="wordle", split="train", index=0)
    headers = {**owner.headers, "X-Session-ID": sid}
    codes = []
    for _ in range(4):
        r = await client.post("/wordle/call", headers=headers, json={"name": "guess", "input": {"word": "zzzzz"}})
        codes.append(r.status_code)
        if r.status_code == 200:
            assert "ok" in sse_result(r.text)
        else:
            assert "maximum capacity" in r.json()["detail"] and r.headers["Retry-After"] == "1"
    assert codes[:2] == [200, 200] and 429 in codes[2:]
