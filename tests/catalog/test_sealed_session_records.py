"""A session on a sealed split records its task spec (the owners' publish keys, and the owning team's
publishers on the web, read it back), yet the caller's own session record never hands it to anyone
else: another team that ran the episode, and the owning team's sessions-only keys and viewers, find
no byte of a sealed spec (its `ward` canary) nor of a hidden field (its answer) in any REST route,
analytics page, export, run or rollout page, or OpenEnv observation about the session; the
explorer's text search does not find a session by its sealed spec either, nor does a rollout link to
one by a guessed spec. A sessions-only key of the
owning team reads no hidden answer from any /api/v1/ route, the analytics' task texts included
(docs/hidden-tasks.md)."""

from __future__ import annotations

import json
import re
import time
import uuid

import httpx

from orsplatform.api.urls import urlpatterns as api_routes
from orsplatform.episodes.models import Session
from tests.catalog.support import login
from tests.catalog.vault import body_of, leaked, publish_sums, publish_vault, sealed_leaked, ward
from tests.e2e.helpers import wait_for

Seen = list[tuple[str, int, bytes]]


def _episode(http: httpx.Client, person, create: dict, env: str = "vault") -> tuple[str, list[bytes]]:
    """One ended episode of `person` (a wrong guess: a right one would put the answer in the call's
    recorded input) and the bodies the episode routes answered."""
    sid = http.post("/create_session", headers=person.headers).json()["sid"]
    headers = {**person.headers, "X-Session-ID": sid}
    bodies = [http.post(f"/acme/{env}/create", headers=headers, json=create)]
    assert bodies[0].status_code == 200, bodies[0].text
    bodies.append(http.get(f"/acme/{env}/prompt", headers=headers))
    bodies.append(http.post(f"/acme/{env}/call", headers={**headers, "Accept": "text/event-stream"},
                            json={"name": "submit", "input": {"answer": "nope"}}))
    bodies.append(http.post("/delete", headers=headers))
    return sid, [b.content for b in bodies]


def _ended(count: int) -> None:
    wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).count() == count or None,
             timeout=30, what=f"{count} ended sessions")


def _get(http: httpx.Client, person, paths: list[str], seen: Seen) -> None:
    for path in paths:
        r = http.get(path, headers=person.headers)
        seen.append((f"{person.username} {path}", r.status_code, r.content))


def _session_routes(sids: list[str], run: str) -> list[str]:
    """Every /api/v1/ route that says something about these sessions."""
    paths = ["/api/v1/sessions", "/api/v1/sessions?environment=acme/vault", "/api/v1/analytics/overview",
             "/api/v1/analytics/environments/acme/vault", "/api/v1/analytics/sessions",
             "/api/v1/analytics/sessions?split=test", "/api/v1/analytics/export.jsonl",
             "/api/v1/analytics/export.parquet", "/api/v1/analytics/export.jsonl?split=test",
             "/api/v1/runs", f"/api/v1/runs/{run}"]
    for sid in sids:
        paths += [f"/api/v1/sessions/{sid}", f"/api/v1/analytics/sessions/{sid}", f"/api/v1/rollouts/{sid}"]
    return paths


def _web(browser, team: str, sids: list[str], run: str, seen: Seen, who: str) -> None:
    pages = [f"/analytics/{team}/", f"/analytics/{team}/environments/acme/vault/", f"/analytics/{team}/sessions/",
             f"/analytics/{team}/sessions/?split=test", f"/analytics/{team}/export.jsonl",
             f"/analytics/{team}/export.parquet", f"/analytics/{team}/runs/",
             f"/analytics/{team}/runs/view/?run={run}", f"/analytics/{team}/runs/episodes/?run={run}"]
    pages += [f"/analytics/{team}/sessions/{sid}/" for sid in sids]
    pages += [f"/analytics/{team}/rollouts/{sid}/" for sid in sids]
    for path in pages:
        r = browser.get(path, follow=True)
        seen.append((f"{who} {path}", r.status_code, body_of(r)))


def _searched(http: httpx.Client, person, text: str) -> int:
    r = http.get("/api/v1/analytics/sessions", params={"q": text}, headers=person.headers)
    assert r.status_code == 200, r.text
    return r.json()["total"]


def test_a_sealed_spec_comes_back_only_to_the_owners_publish_keys_and_publishers(server, owner, member, viewer,
                                                                                 outsider):
    publish_vault(owner)
    seen: Seen = []
    found: dict[str, int] = {}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        # Another team, and the owning team's sessions-only key, run the sealed split by split+index (as
        # designed), and one episode each on train; the owner's publish key runs it too.
        theirs = [_episode(http, outsider, {"split": "test", "index": 0}),
                  _episode(http, outsider, {"split": "test", "index": 1}),
                  _episode(http, outsider, {"split": "train", "index": 2})]
        members = [_episode(http, member, {"split": "test", "index": 2}),
                   _episode(http, member, {"split": "train", "index": 3})]
        owners = [_episode(http, owner, {"split": "test", "index": 3})]
        _ended(6)
        sids = {"charlie": [s for s, _ in theirs], "bob": [s for s, _ in members], "alice": [s for s, _ in owners]}
        for _, bodies in theirs + members:
            seen += [("episode route", 200, b) for b in bodies]
        for person in (outsider, member):
            _get(http, person, _session_routes(sids[person.username], f"{person.username}-key"), seen)
            # The live face: an OpenEnv observation and state of a sealed episode carry no spec either.
            reset = http.post("/openenv/acme/vault/reset", headers=person.headers, json={"split": "test", "index": 4})
            assert reset.status_code == 200, reset.text
            seen.append((f"{person.username} openenv reset", reset.status_code, reset.content))
            _get(http, person, ["/openenv/acme/vault/state"], seen)
            # The explorer's text search is no oracle for the sealed spec.
            found[person.username] = _searched(http, person, ward(0)[:12]) + _searched(http, person, "WARDSEALED")
        # The owner's publish key still reads the sealed spec of its team's sessions (the hidden field
        # never: the record is stored without it).
        mine = http.get(f"/api/v1/sessions/{sids['alice'][0]}", headers=owner.headers).json()
        assert mine["sealed"] is True and mine["task_spec"]["ward"] == ward(3)
        assert "answer" not in mine["task_spec"]
        bobs = http.get(f"/api/v1/analytics/sessions/{sids['bob'][0]}", headers=owner.headers).json()
        assert bobs["task_spec"]["ward"] == ward(2)
        exported = http.get("/api/v1/analytics/export.jsonl", headers=owner.headers).content
        assert ward(2).encode() in exported and ward(3).encode() in exported and not leaked(exported)
        assert _searched(http, owner, "WARDSEALED") == 3  # bob's two (one through OpenEnv) and alice's
        reset = http.post("/openenv/acme/vault/reset", headers=owner.headers, json={"split": "test", "index": 5})
        assert reset.json()["observation"]["metadata"]["task_spec"]["ward"] == ward(5)

    # The web: the outsider (its own team's pages) and the owning team's viewer see no sealed spec;
    # the owning team's publisher does.
    _web(login(outsider), "globex", sids["charlie"], "charlie-key", seen, "charlie")
    _web(login(viewer), "acme", sids["bob"], "bob-key", seen, "vera")
    publisher = login(owner).get(f"/analytics/acme/sessions/{sids['bob'][0]}/")
    assert publisher.status_code == 200 and ward(2).encode() in publisher.content

    assert len(seen) > 60
    assert [(where, status) for where, status, _ in seen if status >= 500] == []
    assert [(where, sealed_leaked(body)) for where, _, body in seen if sealed_leaked(body)] == []
    assert [(where, leaked(body)) for where, _, body in seen if leaked(body)] == []
    assert found == {"charlie": 0, "bob": 0}
    # The search was not of empty answers: the records are there, marked sealed, without their spec.
    detail = [json.loads(b) for where, s, b in seen if where == f"charlie /api/v1/sessions/{sids['charlie'][0]}"][0]
    assert (detail["split"], detail["task_index"], detail["sealed"], detail["task_spec"]) == ("test", 0, True, None)
    assert any(b"sealed" in body for where, _, body in seen if where.startswith("vera") and "/sessions/" in where)


def test_a_rollout_links_to_a_sealed_session_by_its_index_never_by_a_guessed_spec(server, owner, outsider):
    publish_vault(owner)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        sid, _ = _episode(http, outsider, {"split": "test", "index": 0})

        def rollout(**fields) -> str | None:
            event = {"eventType": "rollout", "eventId": str(uuid.uuid4()), "timestamp": int(time.time() * 1000),
                     "runName": "guesses", "environment": "acme/vault", "split": "test", **fields}
            assert http.post("/v1/rollouts", headers=outsider.headers, json={"events": [event]}).status_code == 200
            found = http.get(f"/api/v1/rollouts/{event['eventId']}", headers=outsider.headers).json()
            return found["session"]["sid"] if found["session"] else None

        # The right spec, which the caller cannot read: a link would confirm the guess.
        guess = {"id": "test-0", "question": "Open vault test 0", "ward": ward(0)}
        assert rollout(task_spec=guess) is None
        assert rollout(rollout_info={"task_index": 0}) == sid


def _route_paths(values: dict[str, str]) -> list[str]:
    """Every /api/v1/ route of orsplatform/api/urls.py, its parameters filled in from `values`."""
    paths = []
    for route in api_routes:
        pattern = str(route.pattern)
        if pattern.startswith("v1/"):
            paths.append("/api/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], pattern))
    return paths


def test_a_sessions_only_key_of_the_owning_team_reads_no_hidden_answer_from_any_api_route(server, owner, member):
    publish_sums(owner)
    seen: Seen = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        task = http.post("/acme/sums/task", headers=member.headers, json={"split": "train", "index": 1}).json()["task"]
        assert task == {"a": 1, "b": 7}
        episodes = [_episode(http, member, {"task_spec": task}, env="sums"),
                    _episode(http, member, {"split": "train", "index": 2}, env="sums"),
                    _episode(http, member, {"split": "train", "index": 4}, env="sums")]
        _ended(3)
        sid = episodes[0][0]
        values = {"team": "acme", "slug": "sums", "number": "1", "split": "train", "sid": sid, "job_id": "1",
                  "agent_id": "1", "run_id": "1", "name": "bob-key", "ref": sid}
        paths = _route_paths(values)
        paths += [f"/api/v1/sessions/{s}" for s, _ in episodes] + [f"/api/v1/analytics/sessions/{s}" for s, _ in episodes]
        paths += ["/api/v1/environments/acme/sums/splits/train/tasks?limit=100",
                  "/api/v1/leaderboards/acme/sums?split=train", "/api/v1/analytics/environments/acme/sums?range=all",
                  "/api/v1/analytics/sessions?q=SECRET", "/api/v1/runs/bob-key?split=train"]
        _get(http, member, paths, seen)
        for _, bodies in episodes:
            seen += [("episode route", 200, b) for b in bodies]
    assert len(seen) > 40
    assert [(where, status) for where, status, _ in seen if status >= 500] == []
    assert [(where, leaked(body)) for where, _, body in seen if leaked(body)] == []
    # The report did list the tasks (the search was not of empty answers), by their JSON without the answer.
    report = [json.loads(b) for where, s, b in seen if where == "bob /api/v1/analytics/environments/acme/sums"][0]
    listed = report["hardest_tasks"] + report["easiest_tasks"]
    assert sorted(t["task_text"] for t in listed) == [f'{{"a": {i}, "b": 7}}' for i in (1, 2, 4)]
