"""How an ORS or OpenEnv episode gets its run: a `run` field, the X-Run header, else the key's name."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from orsplatform.episodes.models import Session
from orsplatform.runs.models import Run
from tests.fixtures.ors import start_episode

MATH = "/openenv/builtin/math"


async def _run_of(sid: str) -> str:
    return await sync_to_async(lambda: Session.objects.get(sid=sid).run_name)()


async def _runs(team) -> list[str]:
    return await sync_to_async(lambda: sorted(Run.objects.filter(team=team).values_list("name", flat=True)))()


async def test_an_ors_episode_without_a_run_belongs_to_its_api_keys_run(client, owner):
    sid = await start_episode(client, owner.headers)
    assert await _run_of(sid) == "alice-key"
    assert await _runs(owner.team) == ["alice-key"]


async def test_the_x_run_header_names_an_ors_episodes_run(client, owner):
    sid = await start_episode(client, {**owner.headers, "X-Run": "grpo-7"})
    assert await _run_of(sid) == "grpo-7"


async def test_a_run_field_in_create_wins_over_the_header(client, owner):
    sid = await start_episode(client, {**owner.headers, "X-Run": "from-header"},
                              split="train", index=0, run="from-body")
    assert await _run_of(sid) == "from-body"
    assert await _runs(owner.team) == ["from-body"]


async def test_a_run_named_by_a_deferred_create_is_kept_until_the_environment_is_named(client, owner):
    # ors.client's split+index create names no environment; the first /math/prompt binds it.
    sid = await start_episode(client, owner.headers, env="", split="train", index=0, run="deferred")
    r = await client.get("/math/prompt", headers={**owner.headers, "X-Session-ID": sid})
    assert r.status_code == 200, r.text
    assert await _run_of(sid) == "deferred"


async def test_a_bad_run_name_is_a_400_and_records_nothing(client, owner):
    r = await client.post("/create_session", headers=owner.headers)
    sid = r.json()["sid"]
    for bad in ({"run": 5}, {"run": "x" * 201}, {"run": "a\nb"}):
        r = await client.post("/math/create", headers={**owner.headers, "X-Session-ID": sid},
                              json={"split": "train", "index": 0, **bad})
        assert r.status_code == 400 and set(r.json()) == {"detail"}, r.text
    assert await sync_to_async(Session.objects.count)() == 0
    assert await _runs(owner.team) == []


async def test_an_openenv_reset_takes_its_run_from_the_run_field(client, owner):
    r = await client.post(f"{MATH}/reset", headers=owner.headers, json={"split": "test", "index": 1, "run": "oe-run"})
    assert r.status_code == 200, r.text
    session = await sync_to_async(Session.objects.get)()
    assert session.run_name == "oe-run" and session.protocol == Session.Protocol.OPENENV


async def test_an_openenv_reset_without_a_run_uses_the_keys_name(client, member):
    r = await client.post(f"{MATH}/reset", headers=member.headers, json={"split": "test", "index": 1})
    assert r.status_code == 200, r.text
    assert (await sync_to_async(Session.objects.get)()).run_name == "bob-key"


async def test_an_openenv_reset_with_a_bad_run_is_a_4xx_with_detail(client, owner):
    r = await client.post(f"{MATH}/reset", headers=owner.headers, json={"split": "test", "index": 1, "run": "a\x00b"})
    assert 400 <= r.status_code < 500 and "detail" in r.json(), r.text
    assert await sync_to_async(Session.objects.count)() == 0
