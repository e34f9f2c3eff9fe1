"""Hidden task fields never come back through the analytics: a sessions-only key of the owning team
reads no hidden answer from any /api/v1/ route, the analytics' task texts included (the team's keys
are not the owners' publish keys, and the answer is for no key at all: docs/hidden-tasks.md)."""

from __future__ import annotations

import json
import re

import httpx

from orsplatform.api.urls import urlpatterns as api_routes
from orsplatform.episodes.models import Session
from tests.catalog.vault import leaked, publish_sums
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
