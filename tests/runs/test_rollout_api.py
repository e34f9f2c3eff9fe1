"""POST /v1/rollouts and the look-ups the openreward client makes, in process (the ASGI app with its
body limits): statuses the client expects, whole-or-nothing batches, retries, gzip, tenancy."""

from __future__ import annotations

import gzip
import json
import uuid

import pytest
from asgiref.sync import sync_to_async

from orsplatform.runs.models import Rollout, RolloutMessage, Run

NOW_MS = 1_790_000_000_000


def started(run: str = "r1", **extra) -> dict:
    return {"eventType": "rollout", "eventId": str(uuid.uuid4()), "timestamp": NOW_MS, "runName": run, **extra}


def message(rollout: dict, index: int, **extra) -> dict:
    return {"eventType": "message", "eventId": str(uuid.uuid4()), "timestamp": NOW_MS + index, "index": index,
            "rolloutEventId": rollout["eventId"], "type": "assistant_message", "content": f"m{index}", **extra}


async def post(client, person, events, **headers):
    return await client.post("/v1/rollouts", headers={**person.headers, **headers}, json={"events": events})


def counts() -> tuple[int, int, int]:
    return Run.objects.count(), Rollout.objects.count(), RolloutMessage.objects.count()


acounts = sync_to_async(counts)


def assert_detail(r, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"detail"} and body["detail"], body
    return body["detail"]


async def test_a_started_rollout_then_its_messages_are_stored_with_their_rewards(client, owner):
    rollout = started(run_info={"model_name": "m"}, split="train", task_spec={"q": 1})
    r = await post(client, owner, [rollout])
    assert r.status_code == 200 and r.json() == {"accepted": 1, "duplicates": 0}
    r = await post(client, owner, [message(rollout, 0), message(rollout, 1, reward=0.25),
                                   message(rollout, 2, reward=0.5, isFinished=True, metadata={"k": "v"})])
    assert r.json() == {"accepted": 3, "duplicates": 0}
    row = await sync_to_async(Rollout.objects.select_related("run").get)()
    assert (row.messages, row.reward, row.finished, row.seq, row.split) == (3, 0.75, True, 1, "train")
    assert (row.run.name, row.run.rewarded, row.run.reward_sum, row.run.model_name) == ("r1", 1, 0.75, "m")
    assert row.api_key_id is not None and row.task_spec == {"q": 1}


async def test_a_retried_batch_is_stored_once(client, owner):
    rollout = started()
    batch = [rollout, message(rollout, 0, reward=1.0), message(rollout, 1)]
    assert (await post(client, owner, batch)).json() == {"accepted": 3, "duplicates": 0}
    assert (await post(client, owner, batch)).json() == {"accepted": 0, "duplicates": 3}
    assert await acounts() == (1, 1, 2)
    run = await sync_to_async(Run.objects.get)()
    assert (run.rollouts, run.messages, run.reward_sum) == (1, 2, 1.0)


async def test_messages_arriving_out_of_order_in_separate_batches_all_count(client, owner):
    rollout = started()
    await post(client, owner, [rollout])
    await post(client, owner, [message(rollout, 2, reward=1.0, isFinished=True)])
    await post(client, owner, [message(rollout, 0), message(rollout, 1)])
    row = await sync_to_async(Rollout.objects.get)()
    assert (row.messages, row.reward, row.finished) == (3, 1.0, True)


async def test_a_rollout_update_merges_rollout_info_and_sets_the_step(client, owner):
    rollout = started()
    await post(client, owner, [rollout])
    update = {"eventType": "rollout_update", "eventId": rollout["eventId"], "timestamp": NOW_MS + 5,
              "rollout_info": {"task_index": 7, "current_step": 42, "harness": "trl"}}
    assert (await post(client, owner, [update])).status_code == 200
    row = await sync_to_async(Rollout.objects.get)()
    assert (row.step, row.task_index, row.info["harness"]) == (42, 7, "trl")


@pytest.mark.parametrize("bad, status", [
    ({"eventType": "nope"}, 422),
    ({"eventType": "message", "type": "assistant_message"}, 422),  # no ids
    ("not an object", 422),
    ({"eventType": "rollout", "eventId": "x", "timestamp": NOW_MS}, 422),  # no runName
    ({"eventType": "rollout", "eventId": "x", "timestamp": "yesterday", "runName": "r"}, 422),
    ({"eventType": "rollout", "eventId": "x" * 65, "timestamp": NOW_MS, "runName": "r"}, 422),
    ({"eventType": "rollout", "eventId": "x", "timestamp": NOW_MS, "runName": "a\x00b"}, 422),
])
async def test_a_bad_event_refuses_the_whole_batch_with_a_4xx(client, owner, bad, status):
    good = started()
    r = await post(client, owner, [good, message(good, 0), bad])
    assert_detail(r, status)
    assert await acounts() == (0, 0, 0)


async def test_bad_message_fields_are_422_naming_the_field(client, owner):
    rollout = started()
    await post(client, owner, [rollout])
    for field, value in (("type", "shout"), ("reward", "high"), ("index", -1), ("isFinished", "yes"),
                         ("metadata", [1]), ("content", 5), ("index", 2**40)):
        detail = assert_detail(await post(client, owner, [{**message(rollout, 0), field: value}]), 422)
        assert field in detail, detail
    assert await acounts() == (1, 1, 0)


async def test_a_message_for_an_unknown_rollout_writes_nothing_of_its_batch(client, owner):
    rollout = started()
    detail = assert_detail(await post(client, owner, [rollout, message(started(), 0)]), 422)
    assert "Unknown rollout" in detail
    assert await acounts() == (0, 0, 0)


async def test_non_finite_rewards_are_refused(client, owner):
    rollout = started()
    body = json.dumps({"events": [rollout, message(rollout, 0, reward=float("nan"))]})
    r = await client.post("/v1/rollouts", headers={**owner.headers, "Content-Type": "application/json"}, content=body)
    assert "Non-finite numbers are not accepted" in assert_detail(r, 400)


def _nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


async def test_deep_nesting_and_non_finite_numbers_anywhere_are_a_400_that_says_so_and_write_nothing(
        client, owner, outsider):
    rollout = started()
    bodies = {
        "100000 [": (b'{"events": [' + b"[" * 100_000, "nested too deeply: at most 100 levels"),
        "150 levels of metadata": (json.dumps({"events": [{**rollout, "metadata": _nested(150)}]}).encode(),
                                   "nested too deeply: at most 100 levels"),
        # NaN where nothing checks it: PostgreSQL's jsonb refused it at insert, answered a misleading 409.
        "NaN metadata": (json.dumps({"events": [{**rollout, "metadata": {"score": float("nan")}}]}).encode(),
                         "Non-finite numbers are not accepted"),
        "Infinity task_spec": (json.dumps({"events": [{**rollout, "task_spec": {"x": float("inf")}}]}).encode(),
                               "Non-finite numbers are not accepted"),
        "-Infinity step": (json.dumps({"events": [rollout]}).replace('"r1"', '"r1", "step": -Infinity').encode(),
                           "Non-finite numbers are not accepted"),
    }
    for person in (owner, outsider):
        for label, (content, reason) in bodies.items():
            r = await client.post("/v1/rollouts", content=content,
                                  headers={**person.headers, "Content-Type": "application/json"})
            assert reason in assert_detail(r, 400), label
            gzipped = await client.post("/v1/rollouts", content=gzip.compress(content),
                                        headers={**person.headers, "Content-Encoding": "gzip"})
            assert reason in assert_detail(gzipped, 400), label
    assert await acounts() == (0, 0, 0)
    # The same batch, clean, is taken: nothing of the refused ones was left half-written.
    assert (await post(client, owner, [rollout, message(rollout, 0, metadata={"score": 1.0})])).json() == {
        "accepted": 2, "duplicates": 0}


async def test_nul_characters_and_lone_surrogates_are_stored_not_a_500(client, owner):
    rollout = started()
    raw = ('{"events": [' + json.dumps(rollout) + ', {"eventType": "message", "eventId": "e", "timestamp": '
           + str(NOW_MS) + ', "index": 0, "rolloutEventId": "' + rollout["eventId"] + '", "type": "user_message", '
           '"content": "a\\u0000b\\ud800c", "metadata": {"k\\u0000": "\\udfff"}}]}')
    r = await client.post("/v1/rollouts", headers={**owner.headers, "Content-Type": "application/json"}, content=raw)
    assert r.status_code == 200, r.text
    stored = await sync_to_async(RolloutMessage.objects.get)()
    assert stored.content.startswith("ab") and "\x00" not in json.dumps(stored.metadata)


async def test_a_gzipped_batch_is_accepted(client, owner):
    rollout = started()
    body = gzip.compress(json.dumps({"events": [rollout, message(rollout, 0)]}).encode())
    r = await client.post("/v1/rollouts", content=body,
                          headers={**owner.headers, "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["accepted"] == 2


async def test_bad_encodings_and_bodies_are_4xx(client, owner):
    headers = {**owner.headers, "Content-Type": "application/json"}
    assert_detail(await client.post("/v1/rollouts", content=b"\x1f\x8bnot gzip",
                                    headers={**headers, "Content-Encoding": "gzip"}), 400)
    assert_detail(await client.post("/v1/rollouts", content=b"{}", headers={**headers, "Content-Encoding": "br"}), 415)
    assert_detail(await client.post("/v1/rollouts", content=b"{nope", headers=headers), 400)
    assert_detail(await client.post("/v1/rollouts", json={"events": []}, headers=headers), 422)
    assert_detail(await client.post("/v1/rollouts", json=[1], headers=headers), 400)
    assert_detail(await client.get("/v1/rollouts", headers=headers), 405)


async def test_a_gzip_bomb_is_a_413(client, owner, settings):
    settings.ORS_ROLLOUT_MAX_JSON_BYTES = 1024 * 1024
    body = gzip.compress(b'{"events": [' + b" " * (4 * 1024 * 1024) + b"]}")
    r = await client.post("/v1/rollouts", content=body, headers={**owner.headers, "Content-Encoding": "gzip"})
    assert_detail(r, 413)


async def test_a_body_over_the_limit_is_a_413_and_one_under_it_passes(client, owner, settings):
    settings.ORS_ROLLOUT_MAX_BODY_BYTES = 64 * 1024
    rollout = started()
    big = message(rollout, 0, content="x" * (70 * 1024))
    assert_detail(await post(client, owner, [rollout, big]), 413)
    assert (await post(client, owner, [rollout, message(rollout, 0, content="x" * (60 * 1024))])).status_code == 200


async def test_the_rollout_api_needs_a_key_with_the_sessions_scope(client, owner, acme):
    from orsplatform.teams.services import api_key_create

    rollout = started()
    r = await client.post("/v1/rollouts", json={"events": [rollout]})
    assert_detail(r, 401)
    r = await client.post("/v1/rollouts", json={"events": [rollout]}, headers={"X-API-Key": "ors_bad_key"})
    assert_detail(r, 401)
    publish_only = await sync_to_async(api_key_create)(team=acme, name="publisher", scopes=["publish"])
    r = await client.post("/v1/rollouts", json={"events": [rollout]}, headers={"X-API-Key": publish_only.token})
    assert_detail(r, 403)
    assert await acounts() == (0, 0, 0)


async def test_another_team_cannot_log_into_a_rollout_and_reuses_ids_in_its_own_space(client, owner, outsider):
    rollout = started()
    await post(client, owner, [rollout])
    assert_detail(await post(client, outsider, [message(rollout, 0)]), 422)
    assert (await post(client, outsider, [rollout])).json() == {"accepted": 1, "duplicates": 0}
    assert await sync_to_async(lambda: sorted(Run.objects.values_list("team__slug", flat=True)))() == ["acme", "globex"]


async def test_a_rollout_naming_an_environment_resolves_it_and_its_version(client, owner, outsider):
    for extra in ({}, {"variant": "v1"}):
        await post(client, owner, [started(environment="builtin/math", **extra)])
    rows = await sync_to_async(lambda: list(Rollout.objects.values_list("environment__slug", "version__number")))()
    assert rows == [("math", 1), ("math", 1)]
    # A private environment of another team is not resolved (the name is kept as sent).
    await post(client, outsider, [started(environment="acme/secret")])
    row = await sync_to_async(Rollout.objects.get)(team=outsider.team)
    assert row.environment_id is None and row.environment_name == "acme/secret"


async def test_the_environment_look_ups_answer_the_client_without_a_key(client, owner):
    r = await client.get("/v1/environments/builtin/math")
    assert r.status_code == 200 and r.json()["name"] == "builtin/math" and r.json()["id"]
    variants = (await client.get("/v1/environments/builtin/math/variants")).json()
    assert variants == [{"id": variants[0]["id"], "name": "v1", "number": 1}]
    assert_detail(await client.get("/v1/environments/builtin/nope"), 404)
    assert_detail(await client.get("/v1/environments/builtin/nope/variants"), 404)
    assert_detail(await client.post("/v1/environments/builtin/math"), 405)


async def test_an_unknown_path_under_v1_is_a_404(client, owner):
    r = await client.get("/v1/nothing-here", headers=owner.headers)
    assert r.status_code == 404
