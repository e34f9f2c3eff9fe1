"""The REST environment detail (and the endpoints beside it) while nothing is current: the first
version still building, or failed. 200 with current_version null, never a 500; tenancy as ever."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from orsplatform.catalog import tasks
from orsplatform.catalog.models import Environment, EnvironmentVersion
from tests.api.needy import needy_package
from tests.catalog.support import api


def package(requirement: str) -> bytes:
    return needy_package(requirement)


@pytest.fixture
def building(owner, settings, monkeypatch):
    """acme/needy, its first version queued for a build no worker has picked up yet."""
    monkeypatch.setattr(tasks.build_version, "delay", lambda version_id: None)  # a broker slow to deliver
    r = api(owner).post("/api/v1/environments/acme/needy/versions",
                        {"package": SimpleUploadedFile("needy.zip", package("easydict==1.13"))})
    assert r.status_code == 202, r.json()
    assert r.json()["status"] == "building"
    return Environment.objects.get(team=owner.team, slug="needy")


@pytest.fixture
def failed(owner, settings):
    """acme/broken, whose first (and only) build failed: its registry cannot be reached."""
    settings.ORS_BUILD_INDEX_URL = "https://127.0.0.1:9/simple"
    r = api(owner).post("/api/v1/environments/acme/broken/versions?wait=1",
                        {"package": SimpleUploadedFile("broken.zip", package("no-such-package-ors-uploads==1.0"))})
    assert r.status_code == 400, r.json()
    assert r.json()["version"]["status"] == "failed"
    return Environment.objects.get(team=owner.team, slug="broken")


def check_nothing_current(person, slug: str, status: str) -> None:
    detail = api(person).get(f"/api/v1/environments/acme/{slug}")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert body["name"] == f"acme/{slug}" and body["current_version"] is None and body["tools"] == []
    assert [(v["number"], v["status"]) for v in body["versions"]] == [(1, status)]
    versions = api(person).get(f"/api/v1/environments/acme/{slug}/versions")
    assert versions.status_code == 200 and versions.json()[0]["current"] is False
    assert api(person).get(f"/api/v1/environments/acme/{slug}/versions/1").json()["status"] == status
    assert api(person).get(f"/api/v1/environments/acme/{slug}/splits").status_code == 200
    assert api(person).get(f"/api/v1/environments/acme/{slug}/splits/train/tasks").status_code == 404


def check_hidden(person, slug: str) -> None:
    for path in ("", "/versions", "/versions/1", "/splits", "/splits/train/tasks"):
        r = api(person).get(f"/api/v1/environments/acme/{slug}{path}")
        assert r.status_code == 404 and r.json() == {"detail": "Environment not found."}


def test_the_detail_is_200_with_no_current_version_while_the_first_version_builds(building, owner, member,
                                                                                   outsider):
    assert building.versions.get().status == EnvironmentVersion.Status.BUILDING
    check_nothing_current(owner, "needy", "building")
    check_nothing_current(member, "needy", "building")
    check_hidden(outsider, "needy")
    check_hidden(None, "needy")


def test_the_detail_is_200_with_no_current_version_after_the_first_build_failed(failed, owner, member, outsider):
    assert failed.current_version is None
    check_nothing_current(owner, "broken", "failed")
    check_nothing_current(member, "broken", "failed")
    check_hidden(outsider, "broken")


def test_an_environment_with_nothing_current_stays_out_of_the_catalog_list(building, owner):
    listed = api(owner).get("/api/v1/environments")
    assert listed.status_code == 200 and "acme/needy" not in [e["name"] for e in listed.json()]
