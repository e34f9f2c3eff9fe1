"""Hidden fields and a sealed test split with the unmodified official clients (`ors.client`, the
`openreward` client, OpenEnv's `GenericEnvClient`) against a real server: episodes by task object
and by split+index still score, sealed reads are 403 for another team and for a member's key
without the publish scope and 200 for the owner's publish key, num_tasks stays public, and no
hidden value appears in any response body a non-owner key (or an anonymous or non-owning browser)
can obtain, searched byte for byte across the ORS, OpenEnv and MCP routes, the REST API, the hub
pages, the analytics pages and exports."""

from __future__ import annotations

import aiohttp
import httpx
import pytest
from django.test import Client
from openenv.core.generic_client import GenericEnvClient
from openreward import OpenReward
from ors.client import ORS

from orsplatform.episodes.models import Session
from tests.catalog.support import login
from tests.catalog.vault import answer, body_of, leaked, publish_vault
from tests.e2e.conftest import openreward_at  # noqa: F401  (the fixture pointing the openreward client)
from tests.e2e.helpers import wait_for


def test_the_ors_client_never_reads_an_answer_yet_scores_by_task_object_and_by_split_and_index(server, owner,
                                                                                               outsider):
    publish_vault(owner)
    with ORS(base_url=server.url, api_key=outsider.token) as client:
        env = client.environment("acme/vault")
        tasks = env.list_tasks("train")
        assert [t.task_spec for t in tasks][2] == {"id": "train-2", "question": "Open vault train 2"}
        assert env.get_task_range("train", 0, 6) == tasks and env.num_tasks("test") == 6
        with env.session(task=tasks[2]) as session:  # the redacted object it read, sent back as is
            assert session.get_prompt()[0].text == "Open vault train 2 (code length 16)"
            assert session.call_tool("submit", {"answer": answer("train", 2)}).reward == 1.0
        with env.session(split="test", index=1) as session:  # a sealed split still runs
            assert session.call_tool("submit", {"answer": answer("test", 1)}).reward == 1.0
        with env.session(split="test", index=2) as session:
            assert session.call_tool("submit", {"answer": "a guess"}).reward == 0.0
        for read in (lambda: env.list_tasks("test"), lambda: env.get_task("test", 0),
                     lambda: env.get_task_range("test", 0, 2)):
            with pytest.raises(aiohttp.ClientResponseError) as refused:
                read()
            assert refused.value.status == 403 and "sealed" in refused.value.message
    rows = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(
        list(Session.objects.filter(team=outsider.team, status=Session.Status.DELETED).order_by("created_at"))),
        what="three ended sessions")
    assert [(r.split, r.task_index, r.sealed, r.total_reward) for r in rows] == [
        ("train", 2, False, 1.0), ("test", 1, True, 1.0), ("test", 2, True, 0.0)]


def test_the_openreward_client_scores_with_redacted_tasks_and_is_refused_sealed_ones(server, owner, outsider,
                                                                                   openreward_at):  # noqa: F811
    publish_vault(owner)
    openreward_at(server.url)
    client = OpenReward(api_key=outsider.token)
    try:
        env = client.environments.get("acme/vault")
        task = env.get_task("train", 3)
        assert task.task_spec == {"id": "train-3", "question": "Open vault train 3"}
        with env.session(task=task) as session:
            assert session.call_tool("submit", {"answer": answer("train", 3)}).reward == 1.0
        with env.session(split="test", index=4) as session:
            assert session.call_tool("submit", {"answer": answer("test", 4)}).reward == 1.0
        with pytest.raises(Exception) as refused:
            env.get_task("test", 0)
        assert "403" in str(refused.value) or "sealed" in str(refused.value)
    finally:
        client.close()


def test_generic_env_client_observations_carry_no_answer_and_episodes_score(server, owner, outsider):
    publish_vault(owner)
    train_task = {"id": "train-5", "question": "Open vault train 5"}
    with GenericEnvClient(base_url=f"{server.url}/openenv/acme/vault", headers=outsider.headers).sync() as env:
        first = env.reset(split="test", index=3)
        meta = first.observation["metadata"]
        # A sealed split's episode runs, but its spec is not echoed to another team.
        assert meta["task_spec"] is None and (meta["split"], meta["index"]) == ("test", 3)
        assert leaked(str(first.observation)) == [] and leaked(str(env.state())) == []
        step = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer("test", 3)}})
        assert (step.reward, step.done) == (1.0, True)
        # A task object is matched back to its stored task, the answer restored for the code only.
        second = env.reset(task_spec=train_task)
        assert second.observation["metadata"]["task_spec"] == train_task
        assert (second.observation["metadata"]["split"], second.observation["metadata"]["index"]) == ("train", 5)
        step = env.step({"type": "call_tool", "tool_name": "submit", "arguments": {"answer": answer("train", 5)}})
        assert step.reward == 1.0 and leaked(str(step.observation)) == []


SEALED_READS = [("POST", "/acme/vault/tasks", {"split": "test"}), ("POST", "/acme/vault/task", {"split": "test", "index": 0}),
                ("POST", "/acme/vault/task_range", {"split": "test", "start": 0, "stop": 3}),
                ("POST", "/openenv/acme/vault/tasks", {"split": "test"}),
                ("POST", "/openenv/acme/vault/task", {"split": "test", "index": 0}),
                ("POST", "/openenv/acme/vault/task_range", {"split": "test", "start": 0, "stop": 3}),
                ("GET", "/api/v1/environments/acme/vault/splits/test/tasks", None)]


def test_a_sealed_split_is_403_for_outsiders_and_members_non_publish_keys_and_200_for_the_owners_publish_key(
        server, owner, member, outsider):
    publish_vault(owner)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for method, path, body in SEALED_READS:
            for person in (outsider, member):
                r = http.request(method, path, headers=person.headers, json=body)
                assert r.status_code == 403, (path, person.username, r.text)
                assert "sealed" in r.json()["detail"] and "publish key" in r.json()["detail"]
            r = http.request(method, path, headers=owner.headers, json=body)
            assert r.status_code == 200, (path, r.text)
            # Even the owner's key never gets the answer on the episode routes; its REST API
            # (the team's own data) shows it.
            assert bool(leaked(r.content)) == path.startswith("/api/"), path
        for person in (outsider, member, owner):
            for prefix in ("", "/openenv"):
                r = http.post(f"{prefix}/acme/vault/num_tasks", headers=person.headers, json={"split": "test"})
                assert r.status_code == 200 and r.json()["num_tasks"] == 6


def _episodes(http: httpx.Client, person) -> list[str]:
    """Two ended episodes of `person` (one per split, one by task object) and their bodies."""
    bodies, sids = [], []
    task = http.post("/acme/vault/task", headers=person.headers, json={"split": "train", "index": 1}).json()["task"]
    for create in ({"task_spec": task}, {"split": "test", "index": 0}):
        sid = http.post("/create_session", headers=person.headers).json()["sid"]
        headers = {**person.headers, "X-Session-ID": sid}
        bodies.append(http.post("/acme/vault/create", headers=headers, json=create).content)
        bodies.append(http.get("/acme/vault/prompt", headers=headers).content)
        bodies.append(http.get("/acme/vault/task_tools", headers=headers).content)
        bodies.append(http.post("/acme/vault/call", headers={**headers, "Accept": "text/event-stream"},
                                json={"name": "submit", "input": {"answer": "nope"}}).content)
        bodies.append(http.post("/delete", headers=headers).content)
        sids.append(sid)
    assert all(leaked(b) == [] for b in bodies)
    return sids


def test_no_response_a_non_owner_can_obtain_carries_a_hidden_value(server, owner, member, outsider):
    publish_vault(owner)
    seen: list[tuple[str, int, bytes]] = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        sids = {p.username: _episodes(http, p) for p in (outsider, member)}
        wait_for(lambda: Session.objects.filter(status=Session.Status.DELETED).count() == 4 or None, what="ended")
        for person in (outsider, member):
            get = ["/health", "/version", "/list_environments", "/acme/vault/tools", "/acme/vault/splits",
                   "/openenv/acme/vault/health", "/openenv/acme/vault/metadata", "/openenv/acme/vault/schema",
                   "/openenv/acme/vault/splits", "/openenv/acme/vault/state",
                   "/api/v1/environments", "/api/v1/environments/acme/vault",
                   "/api/v1/environments/acme/vault/versions", "/api/v1/environments/acme/vault/versions/1",
                   "/api/v1/environments/acme/vault/splits", "/api/v1/environments/acme/vault/splits/train",
                   "/api/v1/environments/acme/vault/splits/train/tasks?limit=100",
                   "/api/v1/environments/acme/vault/splits/test/tasks", "/api/v1/sessions",
                   "/api/v1/analytics/overview", "/api/v1/analytics/environments/acme/vault",
                   "/api/v1/analytics/sessions", "/api/v1/analytics/export.jsonl",
                   "/api/v1/analytics/export.parquet", "/api/v1/leaderboards/acme/vault?split=test"]
            get += [f"/api/v1/sessions/{sid}" for sid in sids[person.username]]
            get += [f"/api/v1/analytics/sessions/{sid}" for sid in sids[person.username]]
            for path in get:
                r = http.get(path, headers=person.headers)
                seen.append((path, r.status_code, r.content))
            posts = [(f"{prefix}/acme/vault/{route}", body) for prefix in ("", "/openenv")
                     for route, body in (("tasks", {"split": "train"}), ("task", {"split": "train", "index": 4}),
                                         ("task_range", {"split": "train"}), ("num_tasks", {"split": "test"}),
                                         ("tasks", {"split": "test"}))]
            posts += [("/openenv/acme/vault/reset", {"split": "test", "index": 2}),
                      ("/openenv/acme/vault/reset", {"task_spec": {"id": "train-0", "question": "Open vault train 0"}}),
                      ("/openenv/acme/vault/step", {"action": {"type": "list_tools"}}),
                      ("/openenv/acme/vault/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})]
            for path, body in posts:
                r = http.post(path, headers=person.headers, json=body)
                seen.append((path, r.status_code, r.content))
        # The web: anonymous, and signed in as the outsider (another team) and the member (no publisher
        # role is needed to be refused a sealed split: bob is a member, and members publish, so he is
        # checked below as the owning team's view instead).
    pages = ["/", "/environments/", "/environments/acme/vault/", "/environments/acme/vault/tasks/",
             "/environments/acme/vault/tasks/?split=train", "/environments/acme/vault/tasks/?split=test",
             "/environments/acme/vault/tasks/train/0/", "/environments/acme/vault/tasks/test/0/",
             "/environments/acme/vault/versions/"]
    browsers = {"anonymous": Client(), "outsider": login(outsider)}
    for who, browser in browsers.items():
        for path in pages:
            r = browser.get(path)
            seen.append((f"{who} {path}", r.status_code, body_of(r)))
        sealed = browser.get("/environments/acme/vault/tasks/test/0/")
        assert sealed.status_code == 403 and b"is sealed" in sealed.content
    web = login(outsider)
    for path in ["/analytics/globex/", "/analytics/globex/environments/acme/vault/", "/analytics/globex/sessions/",
                 "/analytics/globex/export.jsonl", "/analytics/globex/export.parquet", "/aap/globex/"]:
        r = web.get(path)
        seen.append((f"outsider {path}", r.status_code, body_of(r)))
    for sid in sids["charlie"]:
        r = web.get(f"/analytics/globex/sessions/{sid}/")
        assert r.status_code == 200
        seen.append((f"outsider session {sid}", r.status_code, r.content))

    assert len(seen) > 100
    assert [(path, status) for path, status, body in seen if leaked(body)] == []
    assert all(status < 500 for _, status, _ in seen), [(p, s) for p, s, _ in seen if s >= 500]
    # The pages did serve the tasks (the search was not of empty bodies).
    assert any(b"Open vault train 0" in body for path, _, body in seen if "tasks/train/0" in path)
    assert any(b"sealed" in body for path, _, body in seen if path.endswith("/sessions/"))


def test_the_owning_team_sees_its_hidden_fields_on_the_hub_and_others_do_not(owner, outsider):
    publish_vault(owner)
    mine = login(owner).get("/environments/acme/vault/tasks/test/3/")
    assert mine.status_code == 200 and answer("test", 3).encode() in mine.content
    theirs = login(outsider).get("/environments/acme/vault/tasks/train/3/")
    assert theirs.status_code == 200 and b"Open vault train 3" in theirs.content and not leaked(theirs.content)
