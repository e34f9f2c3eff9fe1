"""GET /api/v1/runs, /api/v1/runs/{name} and /api/v1/rollouts/{ref} in process: sessions and rollouts
of one run merged into one series, filters, and the owner / member / outsider tenancy."""

from __future__ import annotations

import uuid

from asgiref.sync import sync_to_async

from orsplatform.episodes.models import Session
from tests.fixtures.ors import start_episode
from tests.ors.support import sid_headers

NOW_MS = 1_790_000_000_000


async def _log(client, person, run: str, *, step: int, reward: float, split: str = "train",
               environment: str = "builtin/math") -> str:
    rollout = {"eventType": "rollout", "eventId": str(uuid.uuid4()), "timestamp": NOW_MS + step, "runName": run,
               "environment": environment, "split": split, "rollout_info": {"current_step": step}}
    msg = {"eventType": "message", "eventId": str(uuid.uuid4()), "timestamp": NOW_MS + step, "index": 0,
           "rolloutEventId": rollout["eventId"], "type": "assistant_message", "content": "4", "reward": reward,
           "isFinished": True}
    r = await client.post("/v1/rollouts", headers=person.headers, json={"events": [rollout, msg]})
    assert r.status_code == 200, r.text
    return rollout["eventId"]


async def test_the_runs_list_and_a_runs_series_merge_rollouts_and_sessions(client, owner, member):
    await _log(client, owner, "exp", step=1, reward=1.0)
    await _log(client, owner, "exp", step=2, reward=0.0, split="test")
    sid = await start_episode(client, {**owner.headers, "X-Run": "exp"})
    r = await client.post("/math/call", headers=sid_headers(owner, sid),
                          json={"name": "submit", "input": {"answer": "nope"}})
    assert r.status_code == 200
    await client.post("/delete", headers=sid_headers(owner, sid))

    runs = (await client.get("/api/v1/runs", headers=member.headers)).json()["runs"]
    assert [(r["name"], r["rollouts"], r["episodes"]) for r in runs] == [("exp", 2, 1)]
    detail = (await client.get("/api/v1/runs/exp", headers=member.headers)).json()
    kinds = sorted(p["kind"] for p in detail["series"])
    assert kinds == ["rollout", "rollout", "session"]
    session_point = next(p for p in detail["series"] if p["kind"] == "session")
    assert session_point["ref"] == sid and session_point["step"] is None and session_point["length"] == 1
    assert detail["facets"]["splits"] == ["test", "train"]
    only_test = (await client.get("/api/v1/runs/exp?split=test", headers=owner.headers)).json()["series"]
    assert [(p["kind"], p["step"], p["reward"], p["passed"]) for p in only_test] == [("rollout", 2, 0.0, False)]
    by_version = (await client.get("/api/v1/runs/exp?environment=builtin/math&version=1",
                                   headers=owner.headers)).json()["series"]
    assert len(by_version) == 3
    none = (await client.get("/api/v1/runs/exp?version=99", headers=owner.headers)).json()["series"]
    assert none == []
    trajectory = (await client.get(f"/api/v1/rollouts/{sid}", headers=owner.headers)).json()
    assert trajectory["run"] == "exp" and [c["name"] for c in trajectory["tool_calls"]] == ["submit"]


async def test_bad_series_filters_are_400_with_detail(client, owner):
    await _log(client, owner, "exp", step=1, reward=1.0)
    for query in ("version=abc", "version=0", "environment=noslash"):
        r = await client.get(f"/api/v1/runs/exp?{query}", headers=owner.headers)
        assert r.status_code == 400 and set(r.json()) == {"detail"}, (query, r.text)


async def test_a_run_name_with_a_slash_is_reachable(client, owner):
    await _log(client, owner, "sweep/lr-1e-5", step=0, reward=1.0)
    r = await client.get("/api/v1/runs/sweep/lr-1e-5", headers=owner.headers)
    assert r.status_code == 200 and r.json()["name"] == "sweep/lr-1e-5"


async def test_runs_are_invisible_to_another_team_and_need_a_key(client, owner, outsider):
    ref = await _log(client, owner, "private-run", step=0, reward=1.0)
    assert (await client.get("/api/v1/runs", headers=outsider.headers)).json() == {"runs": []}
    for path in ("/api/v1/runs/private-run", f"/api/v1/rollouts/{ref}"):
        r = await client.get(path, headers=outsider.headers)
        assert r.status_code == 404 and set(r.json()) == {"detail"}
        assert (await client.get(path, headers=owner.headers)).status_code == 200
        assert (await client.get(path)).status_code == 401
    assert (await client.get("/api/v1/runs")).status_code == 401


async def test_an_unknown_run_and_a_keys_emptied_default_run_are_404(client, owner):
    assert (await client.get("/api/v1/runs/nothing", headers=owner.headers)).status_code == 404
    # A session in the key's default run, then moved away: the default run is empty, so not listed.
    sid = await start_episode(client, owner.headers)
    await sync_to_async(Session.objects.filter(sid=sid).update)(run_name="elsewhere")
    runs = (await client.get("/api/v1/runs", headers=owner.headers)).json()["runs"]
    assert [r["name"] for r in runs] == ["elsewhere"]
    assert (await client.get("/api/v1/runs/alice-key", headers=owner.headers)).status_code == 404


async def test_nul_characters_in_a_path_are_a_404_not_a_500(client, owner):
    for path in ("/api/v1/runs/a%00b", "/api/v1/rollouts/a%00b", "/v1/environments/a%00/b",
                 "/v1/environments/a/b%00/variants"):
        r = await client.get(path, headers=owner.headers)
        assert r.status_code == 404, (path, r.status_code)
