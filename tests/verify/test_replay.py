"""Verified versions end to end: episodes recorded with the unmodified ors.client through a real
gateway, new versions published through the REST API, their replay run by a real Celery worker on
the test database, the report read back through the REST API and the console."""

from __future__ import annotations

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from ors.client import ORS

from orsplatform.catalog.models import Environment
from orsplatform.episodes.models import Session
from tests.fixtures.celery import wait_until
from tests.verify.packages import HALF_FOR_B, grader_zip, publish, right_answer

pytestmark = pytest.mark.e2e

B_TASKS = ["train/1", "train/3", "train/5"]


def record(base: str, person, indexes: list[int], env: str = "acme/grader") -> None:
    """One episode per index, each a hint then the right answer, closed by the client."""
    client = ORS(base_url=base, api_key=person.token)
    try:
        grader = client.environment(env)
        for index in indexes:
            with grader.session(split="train", index=index) as session:
                session.call_tool("hint", {})
                assert session.call_tool("submit", {"answer": right_answer(index)}).reward == 1.0
    finally:
        client.close()


def wait_recorded(count: int) -> None:
    wait_until(lambda: Session.objects.filter(environment__slug="grader", status="deleted", calls=2).count() == count,
               30, f"{count} episodes recorded")


def url(base: str, number: int, what: str = "verification", team: str = "acme") -> str:
    return f"{base}/api/v1/environments/{team}/grader/versions/{number}/{what}"


def finished(base: str, person, number: int) -> dict:
    def done() -> dict | None:
        body = httpx.get(url(base, number), headers=person.headers).json()
        return body if body.get("status") not in ("queued", "running") else None

    return wait_until(done, 180, f"verification of @{number} finished", interval=0.2)


def current_number() -> int:
    return Environment.objects.select_related("current_version").get(slug="grader").current_version.number


def test_a_version_whose_reward_logic_changed_for_some_tasks_reports_exactly_those_tasks(platform, owner, outsider):
    base = platform.url
    assert publish(base, owner, grader_zip(mark="one", manifest='visibility = "public"\n')).status_code == 201
    record(base, owner, [0, 1, 2, 3, 4, 5, 0, 1])
    record(base, outsider, [0, 1])  # another team's episodes are never replayed for the author
    wait_recorded(10)
    # As if the recorded specs had their hidden fields redacted: the replay must give the
    # environment the full spec from the task store, or no answer would score.
    Session.objects.filter(environment__slug="grader").update(task_spec={"id": "redacted"})

    same = publish(base, owner, grader_zip(mark="two", manifest='visibility = "public"\n'))
    assert same.status_code == 201 and same.json()["current"] is True  # report only: served at once
    report = finished(base, owner, 2)
    assert report["status"] == "reported" and report["baseline"] == 1
    assert report["agreement"] == 1.0 and report["report"]["episodes"] == 8
    assert report["report"]["changed_tasks"] == [] and report["report"]["changed"] == []
    assert {t["task"] for t in report["report"]["tasks"]} == {f"train/{i}" for i in range(6)}

    assert httpx.post(f"{base}/api/v1/environments/acme/grader/rollback", headers=owner.headers,
                      json={"version": 1}).status_code == 200
    changed = publish(base, owner, grader_zip(mark="three", reward=HALF_FOR_B, manifest='visibility = "public"\n'))
    assert changed.status_code == 201
    report = finished(base, owner, 3)
    body = report["report"]
    assert report["status"] == "reported" and current_number() == 3
    assert body["changed_tasks"] == B_TASKS
    assert body["episodes"] == 8 and body["agreeing"] == 4 and report["agreement"] == 0.5
    assert report["items_done"] == report["items_total"] == 8 and report["percent"] == 100
    per_task = {t["task"]: (t["episodes"], t["agreeing"]) for t in body["tasks"]}
    assert per_task == {"train/0": (2, 2), "train/1": (2, 0), "train/2": (1, 1), "train/3": (1, 0),
                        "train/4": (1, 1), "train/5": (1, 0)}
    owner_sids = set(Session.objects.filter(team=owner.team).values_list("sid", flat=True))
    assert len(body["changed"]) == 4 and {c["session"] for c in body["changed"]} <= owner_sids
    for episode in body["changed"]:
        assert episode["task"] in B_TASKS
        assert (episode["old_reward"], episode["new_reward"]) == (1.0, 0.5)
        assert episode["first_difference"] == {
            "call": 1, "name": "submit", "old": {"kind": "ok", "reward": 1.0, "finished": True},
            "new": {"kind": "ok", "reward": 0.5, "finished": True}}


def test_a_version_below_the_threshold_waits_for_its_owner_and_every_endpoint_checks_the_team(
        platform, owner, member, outsider, viewer):
    base = platform.url
    settings_url = f"{base}/api/v1/environments/acme/grader/verify-settings"
    assert publish(base, owner, grader_zip(mark="one")).status_code == 201
    put = httpx.put(settings_url, headers=owner.headers, json={"threshold": 0.9, "sample_size": 50})
    assert put.status_code == 200 and put.json() == {"sample_size": 50, "threshold": 0.9, "report_only": False}
    assert httpx.put(settings_url, headers=member.headers, json={"threshold": 0.1}).status_code == 403
    assert httpx.put(settings_url, headers=outsider.headers, json={"threshold": 0.1}).status_code == 404
    assert httpx.get(settings_url, headers=member.headers).json()["threshold"] == 0.9
    assert httpx.get(settings_url, headers=outsider.headers).status_code == 404
    assert httpx.get(settings_url).status_code == 401

    record(base, owner, [0, 1, 2, 3])
    wait_recorded(4)
    published = publish(base, owner, grader_zip(mark="two", reward=HALF_FOR_B))
    assert published.status_code == 201 and published.json()["current"] is False
    report = finished(base, owner, 2)
    assert report["status"] == "held" and report["gated"] and report["threshold"] == 0.9
    assert report["agreement"] == 0.5 and report["report"]["below_threshold"] is True
    assert report["report"]["changed_tasks"] == ["train/1", "train/3"] and report["current"] is False
    assert current_number() == 1  # published, not served

    # Tenancy: the report is the team's; only a publish key confirms.
    assert httpx.get(url(base, 2), headers=outsider.headers).status_code == 404
    assert httpx.get(url(base, 2, team="globex"), headers=outsider.headers).status_code == 404
    assert httpx.post(url(base, 2, "confirm"), headers=outsider.headers).status_code == 404
    assert httpx.get(url(base, 2), headers=member.headers).json()["status"] == "held"
    refused = httpx.post(url(base, 2, "confirm"), headers=member.headers)
    assert refused.status_code == 403 and "detail" in refused.json()
    assert httpx.post(url(base, 2, "confirm")).status_code == 401
    assert httpx.get(url(base, 1), headers=owner.headers).status_code == 404  # v1 had nothing to verify
    assert current_number() == 1

    # The console's version page: the report and its progress bar, for the team only.
    pages = {name: Client() for name in ("alice", "charlie", "vera")}
    for name, client in pages.items():
        client.force_login(get_user_model().objects.get(username=name))
    page = pages["alice"].get("/console/acme/environments/grader/versions/2/")
    text = page.content.decode()
    assert page.status_code == 200 and 'id="verify-progress"' in text and "train/3" in text
    assert 'id="verify-confirm"' in text and "below the threshold" in text
    state = pages["alice"].get("/console/acme/environments/grader/versions/2/build.json").json()
    assert state["verification"]["status"] == "held" and state["verification"]["percent"] == 100
    assert pages["charlie"].get("/console/acme/environments/grader/versions/2/").status_code == 404
    assert pages["charlie"].post("/console/acme/environments/grader/versions/2/confirm").status_code == 404
    assert pages["vera"].post("/console/acme/environments/grader/versions/2/confirm").status_code == 403
    assert 'id="verify-confirm"' not in pages["vera"].get("/console/acme/environments/grader/versions/2/")\
        .content.decode()
    assert current_number() == 1

    confirmed = httpx.post(url(base, 2, "confirm"), headers=owner.headers)
    assert confirmed.status_code == 200 and confirmed.json()["status"] == "confirmed" and confirmed.json()["current"]
    assert current_number() == 2
    again = httpx.post(url(base, 2, "confirm"), headers=owner.headers)
    assert again.status_code == 409 and "not waiting" in again.json()["detail"]


SOLUTIONS = [
    {"split": "train", "index": 2, "calls": [{"name": "hint"}, {"name": "submit", "input": {"answer": "14"}}],
     "expected_reward": 1.0},
    {"split": "train", "index": 3, "calls": [{"name": "submit", "input": {"answer": "21"}}], "expected_reward": 1.0},
    {"split": "train", "index": 3, "calls": [{"name": "submit", "input": {"answer": "0"}}], "expected_reward": 0.0},
]


def test_reference_solutions_that_fail_keep_a_version_from_becoming_current(platform, owner, outsider):
    base = platform.url
    first = publish(base, owner, grader_zip(mark="one", solutions=SOLUTIONS))
    assert first.status_code == 201 and first.json()["current"] is False  # served once its solutions pass
    report = finished(base, owner, 1)
    assert report["status"] == "passed" and report["report"]["solutions"]["passed"] == 3
    assert current_number() == 1

    missing = {"split": "train", "index": 99, "calls": [{"name": "hint"}], "expected_reward": 0.0}
    publish(base, owner, grader_zip(mark="two", reward=HALF_FOR_B, solutions=[*SOLUTIONS, missing]))
    report = finished(base, owner, 2)
    solutions = report["report"]["solutions"]
    assert report["status"] == "held" and current_number() == 1
    assert (solutions["total"], solutions["passed"], solutions["failed"]) == (4, 2, 2)
    failing = {(s["index"], s["reward"]) for s in solutions["results"] if not s["passed"]}
    assert failing == {(3, 0.5), (99, None)}
    assert "no task train/99" in next(s["error"] for s in solutions["results"] if s["index"] == 99)
    assert httpx.post(url(base, 2, "confirm"), headers=outsider.headers).status_code == 404

    console = Client()
    console.force_login(get_user_model().objects.get(username="alice"))
    page = console.get("/console/acme/environments/grader/versions/2/").content.decode()
    assert "Reference solutions: 2 of 4 pass" in page
    assert console.post("/console/acme/environments/grader/versions/2/confirm").status_code == 302
    assert current_number() == 2
