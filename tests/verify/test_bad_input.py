"""Malformed verification settings and reference solutions are refused with a 4xx that says why
(never a 500, nothing half-written); reads and writes of another team's environment are 404."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from orsplatform.catalog.models import Environment
from orsplatform.verify.models import VerifySettings
from tests.catalog.support import api
from tests.catalog.support import publish as publish_in_process
from tests.verify.packages import grader_zip


@pytest.fixture(autouse=True)
def package_dir(settings, tmp_path):
    settings.ORS_PACKAGE_DIR = tmp_path / "packages"


def publish(person, content: bytes):
    return publish_in_process(person, "grader", "grader.zip", content)


@pytest.mark.parametrize(("solutions", "says"), [
    ([{"split": "train", "index": 0, "calls": [], "expected_reward": 1}], "line 1: 'calls' must be a non-empty"),
    ([{"split": "train", "index": -1, "calls": [{"name": "hint"}], "expected_reward": 1}], "'index'"),
    ([{"split": "train", "index": 0, "calls": [{"name": "hint"}], "expected_reward": "1"}], "'expected_reward'"),
    ([{"split": "train", "index": 0, "calls": [{"input": {}}], "expected_reward": 1}], "call 0 needs a tool"),
    ([["not", "an", "object"]], "JSON object"),
])
def test_malformed_reference_solutions_fail_the_publish_with_the_line(live_db, owner, solutions, says):
    r = publish(owner, grader_zip(mark="x", solutions=solutions))
    assert r.status_code == 400 and r.json()["check"] == "verify" and says in r.json()["detail"]
    assert not Environment.objects.filter(slug="grader").exists()


@pytest.mark.parametrize("table", ["verify = 3", "[verify]\nthreshold = 1.5", "[verify]\nsample = -1",
                                   "[verify]\nsample = true", '[verify]\nthreshold = "high"'])
def test_a_malformed_verify_table_fails_the_publish(live_db, owner, table):
    r = publish(owner, grader_zip(mark="x", manifest=table + "\n"))
    assert r.status_code == 400 and r.json()["check"] == "verify" and "[verify]" in r.json()["detail"]
    assert not Environment.objects.filter(slug="grader").exists()


def test_a_solutions_file_that_is_not_json_says_so(live_db, owner):
    r = publish(owner, grader_zip(mark="x", solutions_text='\n{"split": "train"}{not json\n'))
    assert r.status_code == 400 and "line 2: not JSON" in r.json()["detail"]


@pytest.mark.parametrize("body", [{"threshold": 1.5}, {"threshold": "high"}, {"sample_size": -1},
                                  {"sample_size": 10 ** 9}, {"report_only": "perhaps"}])
def test_bad_replay_settings_are_400_and_change_nothing(live_db, owner, body):
    assert publish(owner, grader_zip(mark="x")).status_code == 201
    r = api(owner).put("/api/v1/environments/acme/grader/verify-settings", body, content_type="application/json")
    assert r.status_code == 400 and isinstance(r.json()["detail"], str)
    assert not VerifySettings.objects.exists()
    broken = api(owner).put("/api/v1/environments/acme/grader/verify-settings", "{nope",
                            content_type="application/json")
    assert broken.status_code == 400 and "detail" in broken.json()


def test_verification_endpoints_of_versions_without_one_or_of_other_teams_are_404(live_db, owner, member, outsider):
    assert publish(owner, grader_zip(mark="x")).status_code == 201
    for person in (owner, member):
        r = api(person).get("/api/v1/environments/acme/grader/versions/1/verification")
        assert r.status_code == 404 and "no verification" in r.json()["detail"]
        assert api(person).get("/api/v1/environments/acme/grader/versions/7/verification").status_code == 404
    assert api(owner).post("/api/v1/environments/acme/grader/versions/1/confirm").status_code == 404
    assert api(member).post("/api/v1/environments/acme/grader/versions/1/confirm").status_code == 403
    assert api(outsider).get("/api/v1/environments/acme/grader/versions/1/verification").status_code == 404
    assert api(outsider).get("/api/v1/environments/acme/grader/verify-settings").status_code == 404
    assert api().get("/api/v1/environments/acme/grader/verify-settings").status_code == 401


def test_the_console_saves_replay_settings_for_publishers_of_the_team_only(live_db, owner, viewer, outsider):
    assert publish(owner, grader_zip(mark="x")).status_code == 201
    users = get_user_model().objects
    url = "/console/acme/environments/grader/verify-settings"
    alice, vera, charlie = Client(), Client(), Client()
    alice.force_login(users.get(username="alice"))
    vera.force_login(users.get(username="vera"))
    charlie.force_login(users.get(username="charlie"))
    assert vera.post(url, {"sample_size": 5}).status_code == 403
    assert charlie.post(url, {"sample_size": 5}).status_code == 404
    assert alice.post(url, {"threshold": "7"}).status_code == 302
    assert not VerifySettings.objects.exists()  # refused with a message, nothing saved
    assert alice.post(url, {"sample_size": 5, "threshold": "0.75"}).status_code == 302
    chosen = VerifySettings.objects.get()
    assert (chosen.sample_size, chosen.threshold, chosen.report_only) == (5, 0.75, False)
    page = alice.get("/console/acme/environments/grader/versions/1/")
    assert page.status_code == 200 and "Not verified" in page.content.decode()
    assert vera.get("/console/acme/environments/grader/versions/1/").status_code == 200
    assert charlie.get("/console/acme/environments/grader/versions/1/").status_code == 404
