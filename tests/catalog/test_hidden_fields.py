"""Hidden task fields (docs/hidden-tasks.md) on the in-process ORS app: a manifest hides the answer
of tasks an environment computes in code; every read serves them without it; /create by task
object is matched back to the stored task (rehydrated: the episode still scores), a task object
that matches nothing is a 400 that says why; the audit copy of the task is the redacted one."""

from __future__ import annotations

import json

from orsplatform.catalog.hidden import digest, redact
from orsplatform.catalog.models import Split, TaskDigest
from orsplatform.episodes.models import Session
from tests.catalog.support import in_thread
from tests.catalog.vault import answer, leaked, publish_vault, set_split, ward
from tests.fixtures.ors import sse_result


def test_the_manifest_hides_the_answer_on_every_split_and_seals_the_test_split(owner):
    publish_vault(owner)
    splits = {s.name: s for s in Split.objects.filter(environment__slug="vault")}
    assert splits["train"].hidden_fields == ["answer"] and not splits["train"].sealed
    assert splits["test"].hidden_fields == ["answer"] and splits["test"].sealed
    # One digest per task, of the task as clients see it.
    rows = dict(TaskDigest.objects.filter(split=splits["train"]).values_list("index", "digest"))
    assert sorted(rows) == list(range(6))
    assert rows[2] == digest({"id": "train-2", "question": "Open vault train 2"}, frozenset())


def test_a_redacted_task_object_digests_like_its_stored_task_whatever_its_key_order():
    stored = {"id": "t", "question": "q", "answer": "a", "n": [1, 2.5, {"b": 1, "a": None}]}
    given = {"n": [1, 2.5, {"a": None, "b": 1}], "question": "q", "id": "t"}
    hidden = frozenset({"answer"})
    assert redact(stored, hidden) == given and digest(stored, hidden) == digest(given, hidden)
    assert digest({**given, "answer": "a guess"}, hidden) == digest(stored, hidden)  # hidden values ignored
    assert digest({**given, "question": "other"}, hidden) != digest(stored, hidden)


async def test_task_reads_never_carry_the_hidden_field(client, owner, outsider):
    await in_thread(publish_vault)(owner)
    for person in (owner, outsider):
        bodies = [
            await client.post("/acme/vault/task", headers=person.headers, json={"split": "train", "index": 3}),
            await client.post("/acme/vault/tasks", headers=person.headers, json={"split": "train"}),
            await client.post("/acme/vault/task_range", headers=person.headers,
                              json={"split": "train", "start": 0, "stop": 6}),
            await client.post("/openenv/acme/vault/task", headers=person.headers, json={"split": "train", "index": 3}),
            await client.post("/openenv/acme/vault/tasks", headers=person.headers, json={"split": "train"}),
            await client.post("/openenv/acme/vault/task_range", headers=person.headers,
                              json={"split": "train", "start": 0, "stop": 6}),
        ]
        assert [b.status_code for b in bodies] == [200] * 6
        assert bodies[0].json()["task"] == {"id": "train-3", "question": "Open vault train 3"}
        assert len(bodies[1].json()["tasks"]) == 6
        assert all(leaked(b.content) == [] for b in bodies)


async def test_an_episode_by_task_object_is_rehydrated_and_scores(client, owner, outsider):
    await in_thread(publish_vault)(owner)
    task = (await client.post("/acme/vault/task", headers=outsider.headers,
                              json={"split": "train", "index": 4})).json()["task"]
    sid = (await client.post("/create_session", headers=outsider.headers)).json()["sid"]
    headers = {**outsider.headers, "X-Session-ID": sid}
    # Key order as a client may send it back: the match is on canonical JSON.
    created = await client.post("/acme/vault/create", headers=headers,
                                json={"task_spec": dict(reversed(list(task.items())))})
    assert created.status_code == 200, created.text
    prompt = (await client.get("/acme/vault/prompt", headers=headers)).json()
    assert prompt[0]["text"] == "Open vault train 4 (code length 16)"  # the code got the answer
    right = sse_result((await client.post("/acme/vault/call", headers=headers,
                                          json={"name": "submit", "input": {"answer": answer("train", 4)}})).text)
    assert right["output"]["reward"] == 1.0 and right["output"]["finished"] is True
    await client.post("/delete", headers=headers)
    row = await in_thread(lambda: Session.objects.get(sid=sid))()
    # Recorded where it came from, and only as the caller may see it.
    assert (row.split, row.task_index, row.sealed) == ("train", 4, False)
    assert row.task_spec == task and leaked(json.dumps(row.task_spec)) == []


async def test_a_task_object_that_matches_no_task_is_a_400_that_says_why(client, owner, outsider):
    await in_thread(publish_vault)(owner)
    sid = (await client.post("/create_session", headers=outsider.headers)).json()["sid"]
    headers = {**outsider.headers, "X-Session-ID": sid}
    made_up = {"id": "train-4", "question": "Open vault train 4 please"}
    r = await client.post("/acme/vault/create", headers=headers, json={"task_spec": made_up})
    assert r.status_code == 400
    assert "matches no task" in r.json()["detail"] and "split and index" in r.json()["detail"]
    assert await in_thread(lambda: Session.objects.filter(sid=sid).exists())() is False


async def test_an_episode_by_split_and_index_scores_and_records_the_redacted_task(client, owner, outsider):
    await in_thread(publish_vault)(owner)
    sid = (await client.post("/create_session", headers=outsider.headers)).json()["sid"]
    headers = {**outsider.headers, "X-Session-ID": sid}
    r = await client.post("/acme/vault/create", headers=headers, json={"split": "test", "index": 5})
    assert r.status_code == 200, r.text
    right = sse_result((await client.post("/acme/vault/call", headers=headers,
                                          json={"name": "submit", "input": {"answer": answer("test", 5)}})).text)
    assert right["output"]["reward"] == 1.0
    await client.post("/delete", headers=headers)
    row = await in_thread(lambda: Session.objects.get(sid=sid))()
    assert row.sealed is True and row.task_spec == {"id": "test-5", "question": "Open vault test 5",
                                                   "ward": ward(5)}


async def test_showing_a_field_again_through_the_rest_api_serves_it_and_drops_its_digests(client, owner):
    await in_thread(publish_vault)(owner)
    r = await in_thread(set_split)(owner, "train", hidden_fields=[])
    assert r.status_code == 200 and r.json()["hidden_fields"] == []
    assert await in_thread(lambda: TaskDigest.objects.filter(split__name="train").count())() == 0
    body = (await client.post("/acme/vault/task", headers=owner.headers, json={"split": "train", "index": 1})).json()
    assert body["task"]["answer"] == answer("train", 1)
