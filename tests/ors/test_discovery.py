"""Discovery endpoints: health, version, the catalog listing, tools, splits and tasks, and how an
environment is addressed (path, versioned path, X-Deployment)."""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.ors import start_episode
from tests.ors.support import PROBE, in_db, publish_probe_sync

BUILTINS = ["builtin/code", "builtin/math", "builtin/vision", "builtin/wordle"]
MATH_TEST_SIZE = 1000


def assert_detail(r, status: int) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], str) and body["detail"], body


async def test_health_answers_ok_without_a_key(client):
    r = await client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_version_reports_the_platform_and_sdk_versions(client, owner):
    r = await client.get("/version", headers=owner.headers)
    assert r.status_code == 200
    body = r.json()
    assert isinstance(body["platform"], str) and body["platform"]
    assert isinstance(body["ors_sdk"], str) and body["ors_sdk"]
    # Both SDKs environments may be written against, as pinned in pyproject.toml.
    assert body["sdks"] == {"ors-sdk": "0.1.0", "openreward": "0.1.167"}
    assert body["environment"] is None


async def test_list_environments_shows_public_and_own_private_environments_as_team_slug(
        client, owner, member, outsider, tmp_path):
    await in_db(publish_probe_sync, owner.team, tmp_path / "acme")
    await in_db(publish_probe_sync, outsider.team, tmp_path / "globex")

    r = await client.get("/list_environments", headers=owner.headers)
    assert r.status_code == 200
    assert r.json() == sorted(BUILTINS + ["acme/probe"])

    r = await client.get("/list_environments", headers=member.headers)
    assert r.json() == sorted(BUILTINS + ["acme/probe"])

    r = await client.get("/list_environments", headers=outsider.headers)
    assert r.json() == sorted(BUILTINS + ["globex/probe"])

    r = await client.get("/list_environments")
    assert r.status_code == 200
    assert r.json() == BUILTINS


async def test_tools_lists_the_shared_tools_with_their_input_schemas(client, owner):
    r = await client.get("/math/tools", headers=owner.headers)
    assert r.status_code == 200
    tools = r.json()["tools"]
    assert [t["name"] for t in tools] == ["submit"]
    submit = tools[0]
    assert submit["description"]
    assert submit["input_schema"]["type"] == "object"
    assert "answer" in submit["input_schema"]["properties"]
    assert submit["input_schema"]["required"] == ["answer"]


async def test_tools_leaves_out_task_specific_tools(client, owner):
    r = await client.get("/vision/tools", headers=owner.headers)
    assert r.status_code == 200
    assert [t["name"] for t in r.json()["tools"]] == ["answer"]


async def test_splits_lists_each_split_name_and_type(client, owner):
    r = await client.get("/math/splits", headers=owner.headers)
    assert r.status_code == 200
    assert r.json() == [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]


async def test_tasks_lists_every_task_of_a_split_with_the_env_name(client, owner):
    r = await client.post("/math/tasks", headers=owner.headers, json={"split": "test"})
    assert r.status_code == 200
    body = r.json()
    assert body["env_name"] == "math"
    assert len(body["tasks"]) == MATH_TEST_SIZE
    assert [t["id"] for t in body["tasks"]] == [f"test-{i}" for i in range(MATH_TEST_SIZE)]
    assert all(set(t) >= {"question", "answer"} for t in body["tasks"])


async def test_num_tasks_counts_the_tasks_of_a_split(client, owner):
    r = await client.post("/math/num_tasks", headers=owner.headers, json={"split": "train"})
    assert r.status_code == 200
    assert r.json() == {"num_tasks": 10_000}
    r = await client.post("/math/num_tasks", headers=owner.headers, json={"split": "test"})
    assert r.json() == {"num_tasks": MATH_TEST_SIZE}


async def test_task_returns_one_task_and_the_env_name(client, owner):
    r = await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["env_name"] == "math"
    assert body["task"]["id"] == "test-7"
    ranged = await client.post("/math/task_range", headers=owner.headers, json={"split": "test", "start": 7, "stop": 8})
    assert ranged.json()["tasks"] == [body["task"]]


SLICES = [
    (None, None),
    (0, 10),
    (10, 0),
    (5, 5),
    (-3, None),
    (None, -997),
    (-5, -2),
    (-2, -5),
    (990, 5000),
    (-5000, 2),
    (2000, 3000),
    (None, 0),
    (-1, 1000),
    (3, -996),
]


async def test_task_range_follows_python_slice_semantics(client, owner):
    problems = []
    for start, stop in SLICES:
        body: dict = {"split": "test"}
        if start is not None:
            body["start"] = start
        if stop is not None:
            body["stop"] = stop
        r = await client.post("/math/task_range", headers=owner.headers, json=body)
        expected = [f"test-{i}" for i in list(range(MATH_TEST_SIZE))[start:stop]]
        if r.status_code != 200:
            problems.append(f"[{start}:{stop}]: {r.status_code} {r.text}")
        elif [t["id"] for t in r.json()["tasks"]] != expected or r.json()["env_name"] != "math":
            got = [t["id"] for t in r.json()["tasks"]]
            problems.append(f"[{start}:{stop}]: {len(got)} tasks {got[:2]}..., want {len(expected)} {expected[:2]}...")
    assert not problems, "\n".join(problems)


async def test_task_range_treats_explicit_nulls_as_defaults(client, owner):
    r = await client.post("/math/task_range", headers=owner.headers, json={"split": "test", "start": None, "stop": None})
    assert r.status_code == 200
    assert len(r.json()["tasks"]) == MATH_TEST_SIZE


@pytest.mark.parametrize("prefix", ["/math", "/builtin/math", "/builtin/math@1"])
async def test_an_environment_can_be_addressed_by_slug_team_slug_and_version(client, owner, prefix):
    splits = await client.get(f"{prefix}/splits", headers=owner.headers)
    assert splits.status_code == 200
    assert [s["name"] for s in splits.json()] == ["train", "test"]
    tools = await client.get(f"{prefix}/tools", headers=owner.headers)
    assert [t["name"] for t in tools.json()["tools"]] == ["submit"]
    n = await client.post(f"{prefix}/num_tasks", headers=owner.headers, json={"split": "test"})
    assert n.json() == {"num_tasks": MATH_TEST_SIZE}
    task = await client.post(f"{prefix}/task", headers=owner.headers, json={"split": "test", "index": 0})
    assert task.status_code == 200
    assert task.json()["task"]["id"] == "test-0"
    assert task.json()["env_name"] == prefix.lstrip("/")


async def test_an_unknown_environment_or_version_answers_404(client, owner):
    for prefix in ["/builtin/math@99", "/builtin/math@0", "/nosuchenv", "/builtin/nosuchenv", "/nosuchteam/math",
                   "/builtin/math@x", "/builtin/math@"]:
        for method, op, body in [("GET", "tools", None), ("GET", "splits", None),
                                 ("POST", "tasks", {"split": "test"}), ("POST", "num_tasks", {"split": "test"}),
                                 ("POST", "task", {"split": "test", "index": 0}),
                                 ("POST", "task_range", {"split": "test"})]:
            r = await client.request(method, f"{prefix}/{op}", headers=owner.headers, json=body)
            assert_detail(r, 404)


async def test_x_deployment_names_the_environment_on_bare_paths(client, owner):
    h = {**owner.headers, "X-Deployment": "builtin/math"}
    r = await client.get("/splits", headers=h)
    assert r.status_code == 200
    assert r.json() == [{"name": "train", "type": "train"}, {"name": "test", "type": "test"}]
    r = await client.post("/task", headers=h, json={"split": "test", "index": 3})
    assert r.status_code == 200
    assert r.json()["task"]["id"] == "test-3"
    assert r.json()["env_name"] == "builtin/math"

    # Not the default environment: the header really selects.
    h = {**owner.headers, "X-Deployment": "builtin/vision"}
    r = await client.post("/num_tasks", headers=h, json={"split": "train"})
    assert r.json() == {"num_tasks": 240}
    r = await client.get("/tools", headers=h)
    assert [t["name"] for t in r.json()["tools"]] == ["answer"]
    r = await client.post("/tasks", headers=h, json={"split": "test"})
    assert r.json()["env_name"] == "builtin/vision"
    assert len(r.json()["tasks"]) == 60


async def test_bare_paths_without_a_deployment_use_the_default_environment(client, owner):
    r = await client.post("/num_tasks", headers=owner.headers, json={"split": "train"})
    assert r.status_code == 200
    assert r.json() == {"num_tasks": 10_000}
    r = await client.post("/task", headers=owner.headers, json={"split": "test", "index": 0})
    assert r.json()["env_name"] == "builtin/math"


@pytest.mark.parametrize("deployment", ["builtin/nosuch", "nosuch/math", "builtin/math@42", "garbage//x", "acme/probe"])
async def test_an_unknown_deployment_answers_404_deployment_not_found(client, outsider, deployment):
    # acme/probe does not exist here; for a team that cannot see it, it must look the same.
    h = {**outsider.headers, "X-Deployment": deployment}
    for method, op, body in [("GET", "splits", None), ("GET", "tools", None), ("POST", "tasks", {"split": "test"}),
                             ("POST", "task", {"split": "test", "index": 0})]:
        r = await client.request(method, f"/{op}", headers=h, json=body)
        assert r.status_code == 404
        detail = r.json()["detail"]
        assert detail.startswith(f"Deployment not found: {deployment!r}. ") and "acme/probe'?" not in detail


async def test_another_teams_private_deployment_answers_like_an_unknown_one(client, owner, outsider, probe):
    r = await client.get("/splits", headers={**owner.headers, "X-Deployment": probe})
    assert r.status_code == 200
    r = await client.get("/splits", headers={**outsider.headers, "X-Deployment": probe})
    assert r.status_code == 404
    # Word for word what a name that exists nowhere gets: the suggestion is never the hidden one.
    unknown = await client.get("/splits", headers={**outsider.headers, "X-Deployment": "acme/qrobe"})
    assert r.json() == {"detail": f"Deployment not found: {probe!r}. No environment this key may use has a similar name."}
    assert unknown.json() == {"detail": "Deployment not found: 'acme/qrobe'. No environment this key may use has a similar name."}


async def test_discovery_calls_carrying_a_session_id_still_work(client, owner):
    for sid in (str(uuid.uuid4()), uuid.uuid4().hex, "not a valid session id!"):
        h = {**owner.headers, "X-Session-ID": sid}
        assert (await client.get("/health", headers=h)).json() == {"status": "ok"}
        r = await client.get("/version", headers=h)
        assert r.status_code == 200 and r.json()["environment"] is None
        assert (await client.get("/list_environments", headers=h)).json() == BUILTINS
        assert (await client.get("/math/tools", headers=h)).status_code == 200
        assert (await client.get("/math/splits", headers=h)).status_code == 200
        r = await client.post("/math/tasks", headers=h, json={"split": "test"})
        assert r.status_code == 200 and len(r.json()["tasks"]) == MATH_TEST_SIZE
        r = await client.post("/math/num_tasks", headers=h, json={"split": "test"})
        assert r.json() == {"num_tasks": MATH_TEST_SIZE}
        r = await client.post("/math/task", headers=h, json={"split": "test", "index": 1})
        assert r.json()["task"]["id"] == "test-1"
        r = await client.post("/math/task_range", headers=h, json={"split": "test", "start": 1, "stop": 3})
        assert [t["id"] for t in r.json()["tasks"]] == ["test-1", "test-2"]
        r = await client.get("/splits", headers={**h, "X-Deployment": "builtin/math"})
        assert r.status_code == 200


async def test_an_invalid_split_answers_400(client, owner):
    for split in ["nosuch", "", "TRAIN", "train ", "validation"]:
        for op, body in [("tasks", {}), ("num_tasks", {}), ("task", {"index": 0}), ("task_range", {})]:
            r = await client.post(f"/math/{op}", headers=owner.headers, json={"split": split, **body})
            assert_detail(r, 400)


async def test_a_missing_split_answers_400(client, owner):
    for op, body in [("tasks", {}), ("num_tasks", {}), ("task", {"index": 0}), ("task_range", {})]:
        r = await client.post(f"/math/{op}", headers=owner.headers, json=body)
        assert_detail(r, 400)


async def test_an_out_of_range_or_negative_index_answers_400(client, owner):
    for index in [MATH_TEST_SIZE, MATH_TEST_SIZE + 1, 10**9, -1, -MATH_TEST_SIZE, -10**9]:
        r = await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": index})
        assert_detail(r, 400)


async def test_the_last_index_of_a_split_is_valid(client, owner):
    r = await client.post("/math/task", headers=owner.headers, json={"split": "test", "index": MATH_TEST_SIZE - 1})
    assert r.status_code == 200
    assert r.json()["task"]["id"] == f"test-{MATH_TEST_SIZE - 1}"


async def test_a_missing_index_answers_400(client, owner):
    r = await client.post("/math/task", headers=owner.headers, json={"split": "test"})
    assert_detail(r, 400)


DISCOVERY_CALLS = [
    ("GET", "tools", None),
    ("GET", "splits", None),
    ("POST", "tasks", {"split": "train"}),
    ("POST", "num_tasks", {"split": "train"}),
    ("POST", "task", {"split": "train", "index": 0}),
    ("POST", "task_range", {"split": "train", "start": 0, "stop": 2}),
]


async def test_another_teams_private_environment_is_indistinguishable_from_a_missing_one(
        client, owner, outsider, tmp_path):
    async def answers(person):
        out = {}
        for prefix in (f"/{PROBE}", "/probe"):
            for method, op, body in DISCOVERY_CALLS:
                r = await client.request(method, f"{prefix}/{op}", headers=person.headers, json=body)
                out[(prefix, op)] = (r.status_code, r.headers.get("content-type"), r.content)
        return out

    before = await answers(outsider)
    assert all(status == 404 for status, _, _ in before.values())
    await in_db(publish_probe_sync, owner.team, tmp_path)

    # The owner's team sees it now...
    for prefix in (f"/{PROBE}", "/probe"):
        for method, op, body in DISCOVERY_CALLS:
            r = await client.request(method, f"{prefix}/{op}", headers=owner.headers, json=body)
            assert r.status_code == 200, (prefix, op, r.text)
    # ...and to another team (and to anonymous callers) it looks exactly as when it did not exist.
    assert await answers(outsider) == before
    anonymous = {}
    for method, op, body in DISCOVERY_CALLS:
        r = await client.request(method, f"/{PROBE}/{op}", json=body)
        anonymous[op] = r
        assert_detail(r, 404)
    missing = await client.get("/acme/nosuchenv/tools", headers=outsider.headers)
    hidden = await client.get(f"/{PROBE}/tools", headers=outsider.headers)
    assert missing.status_code == hidden.status_code == 404
    assert missing.json()["detail"].replace("acme/nosuchenv", "X") == hidden.json()["detail"].replace(PROBE, "X")


async def test_a_bare_slug_prefers_the_callers_own_environment_over_public_ones(client, owner, outsider, tmp_path):
    from orsplatform.teams.services import team_create

    def publish_public_probes() -> None:
        publish_probe_sync(outsider.team, tmp_path / "globex", visibility="public")
        for slug in ("initech", "umbrella", "hooli"):
            publish_probe_sync(team_create(slug=slug, name=slug), tmp_path / slug, visibility="public")

    await in_db(publish_public_probes)
    await in_db(publish_probe_sync, owner.team, tmp_path / "acme")  # the owner's own, published last
    r = await client.get("/list_environments", headers=owner.headers)
    assert {"acme/probe", "globex/probe", "hooli/probe", "initech/probe", "umbrella/probe"} <= set(r.json())

    # Several public environments share the slug, so only the caller's own one is unambiguous.
    r = await client.post("/probe/task", headers=owner.headers, json={"split": "train", "index": 0})
    assert r.status_code == 200, r.text
    assert r.json()["env_name"] == "probe"
    sid = await start_episode(client, owner.headers, env="probe", split="train", index=0)
    r = await client.get("/version", headers={**owner.headers, "X-Session-ID": sid})
    assert r.json()["environment"] == "acme/probe@1"
    # globex's own (public) probe for globex; for a caller with none of its own the slug is ambiguous.
    r = await client.post("/probe/task", headers=outsider.headers, json={"split": "train", "index": 0})
    assert r.status_code == 200, r.text
    r = await client.get("/probe/tools")
    assert r.status_code == 404
