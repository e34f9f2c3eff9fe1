"""A container environment is an environment like any other to every face (docs/containers.md,
"Faces"): its hidden task fields reach the image's server and no client, its sealed split runs by
split and index but is not readable, its episodes land in training runs, its reference solution and
its recorded episodes are replayed against its next version (verified versions), and another team
reaches none of it. Real engine, runsc, builds, server processes; the unmodified clients."""

from __future__ import annotations

import json

import aiohttp
import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from ors.client import ORS

from orsplatform.catalog.models import Environment, EnvironmentVersion
from orsplatform.catalog.pyenvs import log_path
from orsplatform.containers.images import record_read
from orsplatform.episodes.models import Session
from tests.catalog.support import zip_bytes
from tests.containers.conftest import BUILD_SECONDS, LEDGER_CANARY, LEDGER_MANIFEST, faces_package, wait_built
from tests.e2e.helpers import wait_for

VERIFY_SECONDS = 300  # a replay starts the new version's container (its server imports under gVisor)


def _publish(server, person, files: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/environments/acme/ledger/versions", headers=person.headers,
                      files={"package": ("ledger.zip", zip_bytes(files))}, timeout=BUILD_SECONDS)


def _verification(server, person, number: int) -> dict:
    def done() -> dict | None:
        r = httpx.get(f"{server.url}/api/v1/environments/acme/ledger/versions/{number}/verification",
                      headers=person.headers)
        assert r.status_code == 200, r.text
        return r.json() if r.json().get("status") not in ("queued", "running") else None

    return wait_for(done, timeout=VERIFY_SECONDS, what=f"the verification of @{number}")


def _current() -> int | None:
    env = Environment.objects.select_related("current_version").get(team__slug="acme", slug="ledger")
    return env.current_version.number if env.current_version else None


def _ors_episodes(server, member, owner) -> list[str]:
    """Hidden fields and the sealed split over ORS; the bodies served."""
    seen = []
    with ORS(base_url=server.url, api_key=member.token) as client:
        env = client.environment("acme/ledger")
        train = env.list_tasks("train")
        # Hidden fields: no client reads them, the owner's key included (below).
        assert [t.task_spec for t in train] == [{"label": "train-0"}, {"label": "train-1"}]
        assert env.num_tasks("test") == 3  # public
        for read in (lambda: env.list_tasks("test"), lambda: env.get_task("test", 0)):
            with pytest.raises(aiohttp.ClientResponseError) as refused:
                read()
            assert refused.value.status == 403 and "sealed" in refused.value.message
        # By task object: matched back to the stored task, the server resets with the hidden start.
        with env.session(task=train[0]) as session:
            prompt = session.get_prompt()[0].text
            assert '"balance":7' in prompt
            out = session.call_tool("step", {"amount": 3})
            assert (out.reward, out.finished) == (10.0, True)
            seen += [prompt, out.blocks[0].text]
        # A sealed split's episode runs by split and index.
        with env.session(split="test", index=2) as session:
            out = session.call_tool("step", {"amount": 10})
            assert (out.reward, out.finished) == (13.0, True)
            seen.append(out.blocks[0].text)
    with ORS(base_url=server.url, api_key=owner.token) as client:  # the owner's publish key reads the sealed split
        sealed = client.environment("acme/ledger").get_task("test", 1)
        assert sealed.task_spec == {"label": "test-1"}
    return seen


def _openenv_episode(server, member) -> list[str]:
    """A training run's episode on the sealed split over OpenEnv, by split and index; the bodies served."""
    url = f"{server.url}/openenv/acme/ledger"
    with GenericEnvClient(base_url=url, headers=member.headers).sync() as openenv:
        reset = openenv.reset(split="test", index=1, run="grpo-ledger")
        assert reset.observation["balance"] == 2
        step = openenv.step({"amount": 1, "note": "x"})
        assert (step.observation["balance"], step.reward, step.done) == (3, 3.0, False)
        state = openenv.state()
    schema = httpx.get(f"{url}/schema", headers=member.headers)
    assert schema.status_code == 200
    tasks = httpx.post(f"{url}/tasks", headers=member.headers, json={"split": "test"})
    assert tasks.status_code == 403 and "sealed" in tasks.json()["detail"], tasks.text
    return [json.dumps(reset.observation), json.dumps(step.observation), json.dumps(state), schema.text, tasks.text]


def _runs(server, owner, member, rows: list[Session]) -> list[str]:
    """The training run holds the OpenEnv episode; the ORS ones are in the key's default run."""
    run = httpx.get(f"{server.url}/api/v1/runs/grpo-ledger", headers=member.headers)
    assert run.status_code == 200, run.text
    assert [(p["kind"], p["ref"], p["reward"]) for p in run.json()["series"]] == [("session", rows[2].sid, 3.0)]
    runs = httpx.get(f"{server.url}/api/v1/runs", headers=owner.headers).json()["runs"]
    assert {r["name"]: r["episodes"] for r in runs} == {"grpo-ledger": 1, "bob-key": 2}
    sessions = httpx.get(f"{server.url}/api/v1/sessions?environment=acme/ledger", headers=member.headers)
    assert sessions.status_code == 200
    return [run.text, json.dumps(runs), sessions.text]


def _outsider_reaches_nothing(server, outsider, sid: str) -> None:
    """Not the environment over either face, not its runs, sessions or verification."""
    assert httpx.get(f"{server.url}/openenv/acme/ledger/schema", headers=outsider.headers).status_code == 404
    theirs = httpx.post(f"{server.url}/create_session", headers=outsider.headers).json()["sid"]
    created = httpx.post(f"{server.url}/acme/ledger/create", headers={**outsider.headers, "X-Session-ID": theirs},
                         json={"split": "train", "index": 0}, timeout=60)
    assert created.status_code == 404 and set(created.json()) == {"detail"}, created.text
    for path in ("/api/v1/runs/grpo-ledger", "/api/v1/environments/acme/ledger/versions/2/verification",
                 f"/api/v1/sessions/{sid}"):
        r = httpx.get(f"{server.url}{path}", headers=outsider.headers)
        assert r.status_code == 404 and set(r.json()) == {"detail"}, (path, r.text)


def test_a_container_environment_keeps_hidden_fields_sealed_splits_runs_and_verified_versions(
        servers, owner, member, outsider, container_dirs):
    server = servers(**container_dirs)
    r = _publish(server, owner, faces_package())
    assert r.status_code == 202, r.text
    version = wait_built("ledger")
    assert version.status == EnvironmentVersion.Status.READY, (version.error, log_path(version.id).read_text()[-3000:])
    assert [(s["name"], s["type"]) for s in version.splits] == [("test", "test"), ("train", "train")]
    # A first version with a reference solution is held until the solution scores as stated: the
    # replay ran the solution's step in the image's container, on the full task (its hidden start).
    first = _verification(server, member, 1)
    assert first["status"] == "passed", first
    solutions = first["report"]["solutions"]
    assert solutions["passed"] == 1 and [(s["split"], s["index"], s["reward"]) for s in solutions["results"]] == [
        ("train", 0, 10.0)], solutions
    assert _current() == 1

    seen = _ors_episodes(server, member, owner) + _openenv_episode(server, member)
    rows = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(list(
        Session.objects.filter(version=version, status=Session.Status.DELETED).order_by("created_at"))),
        timeout=60, what="three ended episodes")
    assert [(r.protocol, r.split, r.task_index, r.sealed, r.total_reward) for r in rows] == [
        ("ors", "train", 0, False, 10.0), ("ors", "test", 2, True, 13.0), ("openenv", "test", 1, True, 3.0)]
    assert all(LEDGER_CANARY not in json.dumps(r.task_spec) and "start" not in (r.task_spec or {}) for r in rows)
    seen += _runs(server, owner, member, rows)
    assert [body for body in seen if LEDGER_CANARY in body] == []

    # Verified versions: the next version (a changed note, a threshold) replays the team's three
    # episodes in its own container and agrees on every call; it becomes current.
    threshold = LEDGER_MANIFEST + "[verify]\nthreshold = 1.0\n"
    r = _publish(server, owner, faces_package(manifest=threshold, extra={"CHANGES.md": "v2\n"}))
    assert r.status_code == 202, r.text
    second = wait_built("ledger", 2)
    assert second.status == EnvironmentVersion.Status.READY, second.error
    # Only files the .dockerignore leaves out changed: the same image, its layers all cached.
    assert record_read(second.package_path).image == record_read(version.package_path).image
    report = _verification(server, member, 2)
    assert report["status"] == "passed" and report["baseline"] == 1, report
    assert report["agreement"] == 1.0 and report["report"]["episodes"] == 3, report
    assert {t["task"] for t in report["report"]["tasks"]} == {"train/0", "test/1", "test/2"}
    assert _current() == 2
    _outsider_reaches_nothing(server, outsider, rows[0].sid)
